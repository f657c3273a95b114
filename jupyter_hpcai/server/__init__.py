"""jupyter_server extension: authenticated REST endpoints for the JupyterLab side panel."""

from __future__ import annotations

from typing import Any

from .handlers import setup_handlers


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_hpcai.server"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    setup_handlers(server_app.web_app)
    server_app.log.info("jupyter_hpcai: /hpcai/api/allocation and /hpcai/api/engines ready")
