//! Compile check without a GPU: every kernel source compiles with NVRTC 13.0 for sm_80 and sm_90
//! (sm_90a for Hopper-only sources), every declared entry point is reported by ptxas, and no
//! kernel spills registers.
//!
//! Needs libnvrtc on the library path. `scripts/test.sh` (and so CI) provides it through
//! `scripts/setup.d/20-nvrtc.sh`. Without it this test **fails** with that advice, unless
//! `SPECDEC_SKIP_NVRTC_CHECK=1` is set explicitly, in which case it says loudly that it checked
//! nothing.

use specdec_kernels::cuda::{compile, sources, CudaLibraries};

fn nvrtc_or_explain() -> bool {
    if CudaLibraries::probe().nvrtc {
        return true;
    }
    if std::env::var("SPECDEC_SKIP_NVRTC_CHECK").as_deref() == Ok("1") {
        eprintln!(
            "SKIPPED (SPECDEC_SKIP_NVRTC_CHECK=1): libnvrtc not found, no kernel was compile-checked"
        );
        return false;
    }
    panic!(
        "libnvrtc is not on the library path, so the CUDA kernels cannot be compile-checked. \
         Run the suite with scripts/test.sh (it installs NVRTC 13.0 into a venv), or \
         `source scripts/setup.d/20-nvrtc.sh` first; set SPECDEC_SKIP_NVRTC_CHECK=1 to skip \
         on purpose."
    );
}

fn archs_for(source: &sources::KernelSource) -> &'static [&'static str] {
    if source.needs_sm90a {
        &["sm_90a"]
    } else {
        &["sm_80", "sm_90"]
    }
}

#[test]
fn every_kernel_compiles_without_spills() {
    if !nvrtc_or_explain() {
        return;
    }
    let mut failures = Vec::new();
    let mut report = String::new();
    for source in sources::ALL {
        for arch in archs_for(source) {
            let compiled = match compile(source, arch) {
                Ok(c) => c,
                Err(e) => {
                    failures.push(format!("{}@{arch}: {e}", source.name));
                    continue;
                }
            };
            assert!(!compiled.cubin.is_empty());
            for entry in source.entries {
                let Some(r) = compiled.resources.iter().find(|r| r.name == *entry) else {
                    failures.push(format!(
                        "{}@{arch}: entry {entry} missing from the ptxas report",
                        source.name
                    ));
                    continue;
                };
                report.push_str(&format!(
                    "{arch:7} {:22} {:36} regs {:3} spill st/ld {:4}/{:4} stack {:4} smem {:6}\n",
                    source.name,
                    entry,
                    r.registers,
                    r.spill_stores,
                    r.spill_loads,
                    r.stack_frame,
                    r.shared_bytes
                ));
                if r.spills() {
                    failures.push(format!(
                        "{}@{arch}: {entry} spills ({} B stores, {} B loads)",
                        source.name, r.spill_stores, r.spill_loads
                    ));
                }
            }
            if compiled.log.contains("warning") {
                failures.push(format!(
                    "{}@{arch}: warnings:\n{}",
                    source.name, compiled.log
                ));
            }
        }
    }
    eprintln!("{report}");
    assert!(
        failures.is_empty(),
        "kernel compile check failed:\n{}",
        failures.join("\n")
    );
}

#[test]
fn a_broken_source_is_reported_with_its_log() {
    if !nvrtc_or_explain() {
        return;
    }
    static BROKEN: sources::KernelSource = sources::KernelSource {
        name: "broken.cu",
        family: "test",
        code: "extern \"C\" __global__ void k(float* x) { x[0] = undeclared_name; }",
        entries: &["k"],
        needs_sm90a: false,
    };
    let err = compile(&BROKEN, "sm_90").unwrap_err().to_string();
    assert!(err.contains("broken.cu"), "{err}");
    assert!(err.contains("undeclared_name"), "{err}");
}
