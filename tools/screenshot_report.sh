#!/usr/bin/env bash
# Screenshots of the HTML report with headless Chromium (a development step: no test needs Chromium).
#   apt-get install -y chromium     # Debian's package
#   tools/screenshot_report.sh [out/report.html] [docs/img]
# Writes report_first_screen.png (1400x1000: what a reader sees on opening the page) and report_full.png
# (1400 wide, the whole page: FULL_HEIGHT must exceed it; the blank rest is cropped).
set -euo pipefail
html=$(realpath "${1:-out/report.html}")
dest=${2:-docs/img}
height=${FULL_HEIGHT:-12000}
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
# Crop the blank bottom of the full page and store 256-colour PNGs (a third of the size, text stays sharp).
"${PYTHON:-.venv/bin/python}" - "$dest" <<'PY'
import sys
from pathlib import Path

import numpy as np
from PIL import Image

for name in ("report_first_screen.png", "report_full.png"):
    path = Path(sys.argv[1]) / name
    im = Image.open(path).convert("RGB")
    ink = np.where(np.asarray(im.convert("L")).min(axis=1) < 250)[0]
    if name == "report_full.png" and len(ink):
        im = im.crop((0, 0, im.width, min(im.height, int(ink.max()) + 40)))
    im.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    print(path, im.size)
PY
