#!/usr/bin/env bash
# The system packages the tests use, made sure of before `npm test` runs them.
# Missing ones are installed with apt-get when that is possible (root, Debian);
# otherwise one line says what to install, and the tests do not start.
# KEYOP_SKIP_SYSTEM_DEPS=1 skips the check (the tests that need a missing
# tool then fail or skip with their own message).
set -u
[ "${KEYOP_SKIP_SYSTEM_DEPS:-}" = "1" ] && exit 0
[ "$(uname -s)" = "Linux" ] || exit 0

missing=()
need() { # need COMMAND PACKAGE...
  local cmd=$1
  shift
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$@")
}
# The examples' tests: shell with curl, C, Python (standard library only).
need curl curl
need cc gcc libc6-dev
need python3 python3
# Certificate chains are checked with openssl, an independent implementation.
need openssl openssl
# The MQTT listener is tested with the real mosquitto_pub and mosquitto_sub.
need mosquitto_pub mosquitto-clients
# A hub tier is tested on a real 3-node JetStream cluster.
need nats-server nats-server
# The fsync fault test builds a FUSE file system (test/faults/faultfs.c) with libfuse3.
need pkg-config pkg-config
need fusermount3 fuse3
if ! { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists fuse3; }; then missing+=(libfuse3-dev); fi
# The MQTT-over-TLS device example (examples/c/mqtt_tls_device.c) links OpenSSL.
if ! { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists openssl; }; then missing+=(libssl-dev); fi
# The dashboard is tested in a real browser: headless Chromium, driven by puppeteer-core.
need chromium chromium
# The failing-disk test makes ext4 on a loop device.
need mkfs.ext4 e2fsprogs
need losetup mount

[ ${#missing[@]} -eq 0 ] && exit 0
# Each package once, in the order first needed.
pkgs=$(printf '%s\n' "${missing[@]}" | awk '!seen[$0]++' | tr '\n' ' ')
pkgs=${pkgs% }
if [ "${EUID:-$(id -u)}" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "npm test: installing system packages the tests use: $pkgs" >&2
  if apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null; then exit 0; fi
  echo "npm test: apt-get could not install: $pkgs (install them, or set KEYOP_SKIP_SYSTEM_DEPS=1)" >&2
  exit 1
fi
echo "npm test needs system packages: sudo apt-get install $pkgs (or set KEYOP_SKIP_SYSTEM_DEPS=1)" >&2
exit 1
