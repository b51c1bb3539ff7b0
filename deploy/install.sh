#!/bin/sh
# Installs keyop on this machine: the binary for its architecture, a system
# user and group, the directories with the right owners and modes, an
# example configuration (never over an existing one) and the systemd unit.
# Running it again changes nothing that is already right.
#
#   deploy/install.sh [--role hub|device] [--dist DIR] [--binary FILE] [--root DIR]
#
#   --role    which example becomes /etc/keyop/keyop.yaml if there is none (default device)
#   --dist    where the built binaries are (default: dist/ next to this script's folder)
#   --binary  install this file instead of picking one from --dist
#   --root    install under DIR instead of / (for packaging and tests; no systemctl)
#
# Then: put ca.crt and this machine's certificate and key in /etc/keyop/pki
# (see docs/deploy.md) and run: systemctl enable --now keyop
set -eu

here=$(cd "$(dirname "$0")" && pwd)
role=device
dist="$here/../dist"
binary=""
root=""
while [ $# -gt 0 ]; do
  case "$1" in
    --role) role=$2; shift 2 ;;
    --dist) dist=$2; shift 2 ;;
    --binary) binary=$2; shift 2 ;;
    --root) root=$(cd "$2" && pwd); shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$role" in hub|device) ;; *) echo "install.sh: --role must be hub or device" >&2; exit 2 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "install.sh: run as root" >&2; exit 1; }

changed=0
say() { echo "install.sh: $*"; }
change() { changed=$((changed + 1)); say "$*"; }

if [ -z "$binary" ]; then
  case "$(uname -m)" in
    x86_64|amd64) arch=x64 ;;
    aarch64|arm64) arch=arm64 ;;
    *) echo "install.sh: no keyop build for $(uname -m)" >&2; exit 1 ;;
  esac
  # A musl system (Alpine) has a musl loader and no glibc one.
  if ls /lib/ld-musl-* >/dev/null 2>&1 && ! ls /lib*/ld-linux* /lib/*/ld-linux* >/dev/null 2>&1; then arch="$arch-musl"; fi
  binary="$dist/keyop-linux-$arch"
fi
[ -f "$binary" ] || { echo "install.sh: $binary not found (npm run build makes it)" >&2; exit 1; }

# User and group: a system account that cannot log in.
if ! grep -q '^keyop:' "$root/etc/group" 2>/dev/null; then
  if [ -n "$root" ]; then groupadd --system --root "$root" keyop; else groupadd --system keyop; fi
  change "created group keyop"
fi
if ! grep -q '^keyop:' "$root/etc/passwd" 2>/dev/null; then
  nologin=$(command -v nologin || echo /usr/sbin/nologin)
  if [ -n "$root" ]; then
    useradd --system --root "$root" --gid keyop --home-dir /var/lib/keyop --no-create-home --shell "$nologin" keyop
  else
    useradd --system --gid keyop --home-dir /var/lib/keyop --no-create-home --shell "$nologin" keyop
  fi
  change "created user keyop"
fi
uid=$(grep '^keyop:' "$root/etc/passwd" | cut -d: -f3)
gid=$(grep '^keyop:' "$root/etc/group" | cut -d: -f3)

# ensure_dir PATH MODE OWNER GROUP (numeric ids, so --root needs no name lookups)
ensure_dir() {
  if [ ! -d "$1" ]; then
    mkdir -p "$1" && chmod "$2" "$1" && chown "$3:$4" "$1"
    change "created $1"
    return
  fi
  if [ "$(stat -c %a "$1")" != "$2" ]; then chmod "$2" "$1"; change "mode $2 on $1"; fi
  if [ "$(stat -c %u:%g "$1")" != "$3:$4" ]; then chown "$3:$4" "$1"; change "owner of $1"; fi
}
# ensure_file SOURCE DEST MODE: copies when the content differs
ensure_file() {
  if [ ! -f "$2" ] || ! cmp -s "$1" "$2"; then
    install -m "$3" -o 0 -g 0 "$1" "$2"
    change "installed $2"
  elif [ "$(stat -c %a "$2")" != "$3" ]; then
    chmod "$3" "$2"
    change "mode $3 on $2"
  fi
}

ensure_dir "$root/usr/local/bin" 755 0 0
ensure_file "$binary" "$root/usr/local/bin/keyop" 755
ensure_dir "$root/etc/keyop" 750 0 "$gid"
ensure_dir "$root/etc/keyop/pki" 750 0 "$gid"
ensure_dir "$root/var/lib/keyop" 750 "$uid" "$gid"

# The configuration is the operator's: written once, never replaced.
if [ ! -f "$root/etc/keyop/keyop.yaml" ]; then
  install -m 640 -o 0 -g "$gid" "$here/$role.yaml" "$root/etc/keyop/keyop.yaml"
  change "installed $root/etc/keyop/keyop.yaml (from $role.yaml: edit it)"
fi

ensure_dir "$root/etc/systemd/system" 755 0 0
unit_before=$(cat "$root/etc/systemd/system/keyop.service" 2>/dev/null || true)
ensure_file "$here/keyop.service" "$root/etc/systemd/system/keyop.service" 644
if [ -z "$root" ] && [ "$unit_before" != "$(cat /etc/systemd/system/keyop.service)" ] && command -v systemctl >/dev/null; then
  systemctl daemon-reload && say "systemctl daemon-reload"
fi

if [ "$changed" -eq 0 ]; then say "nothing to change"; else say "$changed change(s)"; fi
