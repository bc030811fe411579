# Sourced by the project's scripts: installing Debian packages, as root or through sudo.
#
#   apt_install WHO PKG...   installs those of PKG that are missing (apt-get update first),
#                            saying "WHO: installing ..."; prints nothing when all are there.
#                            Waits up to 10 minutes for apt's locks (unattended upgrades
#                            on a fresh VM). Exits 1 with apt-get's output if it fails, or
#                            when not root and there is no sudo.

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
  # A fresh cloud VM runs unattended upgrades at boot: apt's and dpkg's locks are then held for
  # minutes. apt-get waits for the dpkg lock itself (DPkg::Lock::Timeout); a busy lists lock
  # (apt-get update) makes it fail at once, so such a failure is retried, up to 10 minutes.
  log=$(mktemp)
  local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600)
  local waited=0
  until { "${apt[@]}" update -qq &&
          "${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; do
    if grep -q 'Could not get lock\|Unable to lock\|is held by process' "$log" && [ $waited -lt 600 ]; then
      [ $waited -eq 0 ] && echo "$who: waiting for apt's lock (another apt or unattended-upgrades holds it)"
      sleep 10
      waited=$((waited + 10))
      continue
    fi
    cat "$log" >&2
    rm -f "$log"
    exit 1
  done
  rm -f "$log"
}
