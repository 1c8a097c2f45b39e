#!/usr/bin/env bash
# Takes again the pictures of `harness serve`'s page that README.md and docs/serve.md show:
# docs/page-empty.png, page-streaming.png, page-approval.png (an edit's diff waiting for approval),
# page-narrow.png (390 px wide) and serve.png. The browser tests that reach each state save it when
# HARNESS_PAGE_SCREENSHOTS names a folder, so a picture shows what a test checked.
# Needs the venv (make .venv/.installed) and Chromium with its driver (apt-get install chromium
# chromium-driver); rebuild the page first if web/ changed (cd web && npm run build).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "the pictures need Chromium and chromedriver: apt-get install chromium chromium-driver" >&2
  exit 2
fi
HARNESS_PAGE_SCREENSHOTS=docs .venv/bin/pytest -q tests/test_server_page.py -k \
  "listed_and_opened or streams_its_reply or edit_waiting_for_approval or 390_px or approved_and_another"
ls -l docs/page-*.png docs/serve.png
