#!/usr/bin/env bash
# System packages the test suite needs beyond PyPI: Debian's headless Chromium, which the browser
# test drives through Playwright (no `playwright install` browser download). Idempotent: does
# nothing when /usr/bin/chromium is already there. Needs root (or sudo) for apt-get.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
  SUDO="sudo"
fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
