# shellcheck shell=bash
# Shared by docker/build.sh and docker/smoke-test.sh (sourced, not run): picks the
# container engine and, for podman, prepares the base image and its settings.
#
#   docker  when `docker info` succeeds (an engine is reachable): base image
#           docker.io/library/debian:bookworm-slim, pulled as usual.
#   podman  otherwise: a bookworm base imported from `debootstrap --variant=minbase`
#           (no registry pull needed), run with runc and lowered ulimits, which is what
#           works on machines without a Docker engine (see ../README.md, "Deploying on
#           several machines / containers").
#
# Environment (all optional):
#   FEDLEARN_ENGINE      docker or podman: skip the detection
#   FEDLEARN_IMAGE       image to build and run (default localhost/fedlearn:latest)
#   FEDLEARN_BASE_IMAGE  base of every stage (default: per engine, above)
#   FEDLEARN_CACHE       where the debootstrap tarball and containers.conf live
#                        (default ~/.cache/fedlearn; kept across runs, outside the repo)
#   DEBIAN_MIRROR        debootstrap's mirror (default: the host's, else deb.debian.org)

FEDLEARN_IMAGE="${FEDLEARN_IMAGE:-localhost/fedlearn:latest}"
FEDLEARN_CACHE="${FEDLEARN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fedlearn}"
podman_base_image="localhost/fedlearn-base:bookworm"

# Sets ENGINE to docker or podman; returns 1 when neither can work.
pick_engine() {
  if [ -n "${FEDLEARN_ENGINE:-}" ]; then
    ENGINE="$FEDLEARN_ENGINE"
  elif command -v docker >/dev/null && timeout 20 docker info >/dev/null 2>&1; then
    ENGINE=docker
  elif command -v podman >/dev/null; then
    ENGINE=podman
  else
    return 1
  fi
  if [ "$ENGINE" = podman ]; then
    # Known trap on these machines: crun and podman's default ulimits fail; runc with
    # these ulimits works. CONTAINERS_CONF applies them to every podman command.
    mkdir -p "$FEDLEARN_CACHE"
    if [ -z "${CONTAINERS_CONF:-}" ]; then
      export CONTAINERS_CONF="$FEDLEARN_CACHE/containers.conf"
      cat > "$CONTAINERS_CONF.tmp" <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
CONF
      mv "$CONTAINERS_CONF.tmp" "$CONTAINERS_CONF"
    fi
  fi
}

# The mirror debootstrap uses: DEBIAN_MIRROR, else the host's first Debian URI.
debian_mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local uri
  uri="$(awk '/^URIs:/ && $2 ~ /\/debian\/?$/ {print $2; exit}' \
         /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
  echo "${uri:-http://deb.debian.org/debian}"
}

# Makes sure the podman base image exists: imports it from the cached tarball, and
# makes the tarball with debootstrap first when there is none (needs root; a minute or
# two). Prints the image name.
ensure_podman_base() {
  if podman image exists "$podman_base_image"; then
    echo "$podman_base_image"; return
  fi
  local tarball="$FEDLEARN_CACHE/bookworm-minbase.tar"
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null ||
      { echo "docker/: podman route needs debootstrap (apt-get install debootstrap)" >&2; return 1; }
    local mirror rootfs
    mirror="$(debian_mirror)"
    rootfs="$(mktemp -d "$FEDLEARN_CACHE/rootfs.XXXXXX")"
    echo "docker/: debootstrap --variant=minbase bookworm from $mirror" >&2
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$FEDLEARN_CACHE/debootstrap.log" 2>&1 ||
      { echo "docker/: debootstrap failed, see $FEDLEARN_CACHE/debootstrap.log" >&2; rm -rf "$rootfs"; return 1; }
    # Updates and security fixes too, as Debian's own images have; no leftover .debs.
    cat > "$rootfs/etc/apt/sources.list" <<LIST
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian*}/debian-security bookworm-security main
LIST
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball" ||
      { rm -rf "$rootfs" "$tarball.tmp"; return 1; }
    rm -rf "$rootfs"
  fi
  podman import --quiet --change 'CMD ["/bin/bash"]' "$tarball" "$podman_base_image" \
    >/dev/null || return 1
  echo "$podman_base_image"
}
