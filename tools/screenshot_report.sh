#!/usr/bin/env bash
# Screenshots of the HTML report with headless Chromium (a development step: no test needs Chromium).
#   apt-get install -y chromium     # Debian's package
#   tools/screenshot_report.sh [out/report.html] [docs/img]
# Writes report_first_screen.png (1400x1000: what a reader sees on opening the page) and report_full.png
# (1400 wide, tall enough for the whole page).
set -euo pipefail
html=$(realpath "${1:-out/report.html}")
dest=${2:-docs/img}
height=${FULL_HEIGHT:-9000}
mkdir -p "$dest"
shot() {  # shot NAME WIDTH HEIGHT
    local profile
    profile=$(mktemp -d)
    chromium --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
        --disable-sync --no-first-run --hide-scrollbars --user-data-dir="$profile" \
        --screenshot="$dest/$1" --window-size="$2,$3" "file://$html" 2>/dev/null
    rm -rf "$profile"
    echo "$dest/$1"
}
shot report_first_screen.png 1400 1000
shot report_full.png 1400 "$height"
