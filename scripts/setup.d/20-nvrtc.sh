# shellcheck shell=bash
# Set-up step (sourced by scripts/test.sh): NVRTC 13.0 from the package index, so the kernel
# compile-check test can compile every `.cu` file for sm_80/sm_90 on a machine without a GPU.
#
# Installs into a venv outside the repository, pinned to 13.0.x (NVRTC 13.5 emits PTX 9.5, which
# the GPU machine's driver 580 / CUDA 13.0 rejects), then exports
#   LD_LIBRARY_PATH         += the venv's nvidia/cu13/lib (libnvrtc.so.13, libnvrtc-builtins)
#   SPECDEC_CUDA_INCLUDE     = the venv's nvidia/cu13/include (cuda_fp16.h, cuda_bf16.h)
# Idempotent: a second run finds the stamp file and only exports (well under a second).
# Set SPECDEC_NVRTC_VENV to use another location.

# shellcheck source=00-venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/00-venv.sh"

specdec_nvrtc_setup() {
  local venv="${SPECDEC_NVRTC_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/specdec/venv-nvrtc}"
  local pins="nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96"
  specdec_venv "$venv" "$pins" || return 1
  local root
  root="$("$venv/bin/python" -c 'import nvidia.cu13 as m; print(m.__path__[0])')" || return 1
  if [ ! -e "$root/lib/libnvrtc.so" ] && [ -e "$root/lib/libnvrtc.so.13" ]; then
    # cudarc's loader tries the unversioned name first; pip ships only the versioned one.
    ln -sf libnvrtc.so.13 "$root/lib/libnvrtc.so"
  fi
  case ":${LD_LIBRARY_PATH:-}:" in
    *":$root/lib:"*) ;;
    *) export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
  esac
  export SPECDEC_CUDA_INCLUDE="$root/include"
  echo "   NVRTC: $root/lib (headers: $SPECDEC_CUDA_INCLUDE)"
}
specdec_nvrtc_setup || { echo "NVRTC set-up failed" >&2; return 1 2>/dev/null || exit 1; }
unset -f specdec_nvrtc_setup
