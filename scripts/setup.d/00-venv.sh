# shellcheck shell=bash
# Set-up helper (sourced first by scripts/test.sh): `specdec_venv VENV "PINS"` makes a Python venv
# at VENV holding exactly the pip requirements PINS (space-separated), unless its stamp file says
# it already does. Idempotent; used by the steps that need a Python package.

specdec_venv() {
  local venv="$1" pins="$2"
  local stamp="$venv/.specdec-pins"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$pins" ]; then
    echo "   installing $pins into $venv"
    python3 -m venv "$venv" || return 1
    # shellcheck disable=SC2086
    "$venv/bin/pip" install --quiet --disable-pip-version-check $pins || return 1
    echo "$pins" >"$stamp"
  fi
}
