#!/usr/bin/env bash
# System packages beyond PyPI, from Debian:
#   chromium               the browser test drives it through Playwright (no `playwright install` download)
#   libtcmalloc-minimal4   the allocator every gptforge command uses on CPU where it is installed
#                          (src/gptforge/allocator.py; issue 35: glibc's malloc had the kernel map and
#                          unmap the logits every step, 42% of a CPU run's time); without it gptforge
#                          falls back to glibc tuned in-process, so it is optional for users
# Idempotent: installs only what is missing, and does nothing when everything is there. Needs root
# (or sudo) for apt-get.
set -euo pipefail
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
compgen -G '/usr/lib*/libtcmalloc_minimal.so.4' >/dev/null || compgen -G '/usr/lib/*/libtcmalloc_minimal.so.4' >/dev/null \
  || missing+=(libtcmalloc-minimal4)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
  SUDO="sudo"
fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
