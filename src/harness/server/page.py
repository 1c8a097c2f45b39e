"""The web page at `/`: plain static files (HTML, CSS and JavaScript modules, nothing to build)
that speak the AI SDK UI message stream of `/api/chat` and the native conversation routes.

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
