#!/usr/bin/env bash
# The web inspector's browser tests (tests/test_web.py) drive Debian's headless Chromium through its
# own chromedriver, /usr/bin/chromium and /usr/bin/chromedriver; nothing is downloaded at test time.
# This installs both (Debian's packages chromium and chromium-driver) when either is missing: with
# apt-get as root, or through sudo when it needs no password. Otherwise it says what to install and
# fails, so that README's test command never runs a suite whose browser tests cannot pass.
# Both present: it does nothing, prints nothing.
set -euo pipefail

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    exit 0
fi
say() { echo "install_browser: $*" >&2; }
if ! command -v apt-get >/dev/null 2>&1; then
    say "the browser tests need Chromium at /usr/bin/chromium and its chromedriver at" \
        "/usr/bin/chromedriver; this machine has no apt-get to install them with: install both, then run again"
    exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    say "the browser tests need Debian's chromium and chromium-driver; run" \
        "'sudo apt-get install chromium chromium-driver' once, then this command again"
    exit 1
fi
say "installing Debian's chromium and chromium-driver for the browser tests (apt-get)"
for attempt in 1 2 3; do
    if ${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        ${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; then
        break
    fi
    if [ "$attempt" -eq 3 ]; then
        say "apt-get failed three times; nothing else was changed"
        exit 1
    fi
    sleep 5
done
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    say "apt-get finished but /usr/bin/chromium or /usr/bin/chromedriver is still missing"
    exit 1
fi
