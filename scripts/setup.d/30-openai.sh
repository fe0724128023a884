# shellcheck shell=bash
# Set-up step (sourced by scripts/test.sh): the official `openai` Python client from the package
# index, in a venv outside the repository, for the server test that talks to `specdec serve`
# the way real clients do. Exports SPECDEC_OPENAI_PYTHON (the venv's python). Idempotent: a
# second run finds the stamp file and only exports. Set SPECDEC_OPENAI_VENV to use another place.

# shellcheck source=00-venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/00-venv.sh"

specdec_openai_setup() {
  local venv="${SPECDEC_OPENAI_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/specdec/venv-openai}"
  local pins="openai==3.57.0"
  specdec_venv "$venv" "$pins" || return 1
  export SPECDEC_OPENAI_PYTHON="$venv/bin/python"
}
specdec_openai_setup || { echo "30-openai.sh: installing the openai client failed" >&2; return 1; }
