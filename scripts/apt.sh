# Sourced by the project's scripts: installing Debian packages, as root or through sudo.
#
#   apt_install WHO PKG...   installs those of PKG that are missing (apt-get update first),
#                            saying "WHO: installing ..."; prints nothing when all are there.
#                            Exits 1 with apt-get's output if it fails, or when not root
#                            and there is no sudo.

# Prints the named packages that are not installed, one per line.
missing_packages() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' ||
      echo "$p"
  done
}

apt_install() {
  local who=$1 missing sudo=() log
  shift
  mapfile -t missing < <(missing_packages "$@")
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null ||
      { echo "$who: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  echo "$who: installing ${missing[*]}"
  log=$(mktemp)
  if ! { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
         "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
           apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
}
