"""The web page at `/`: the React app of `web/` (the AI SDK's `useChat` on the UI message stream of
`/api/chat`, the other routes through one typed client), built by Vite into `static/` and committed,
so a user installs no Node; `tests/test_server_page_build.py` checks the build matches its sources.

FastAPI serves them as low-priority routes, so every API route and `/docs` win over a file of the
same name.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter

STATIC = Path(__file__).parent / "static"
"""The page's files, shipped inside the package."""

router = APIRouter()
router.frontend("/", directory=STATIC, fallback=None)
