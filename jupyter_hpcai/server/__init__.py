"""jupyter_server extension (runs in the notebook job's Jupyter server, as the user): authenticated REST endpoints
for the JupyterLab side panel, encrypted kernel connections where the kernel can take them, and, in a server that
hpcai-singleuser started, the port report to the hub once the server listens."""

from __future__ import annotations

from typing import Any

from . import port_report
from .handlers import setup_handlers


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_hpcai.server"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    setup_handlers(server_app.web_app)
    server_app.log.info("jupyter_hpcai: /hpcai/api/allocation, /hpcai/api/recent-jobs, /hpcai/api/engines and "
                        "/hpcai/api/stacks ready")
    # CurveZMQ for kernels whose kernelspec says they take it (kernelspec.py declares it for envs whose ipykernel
    # and zmq can), unless the server's own config chose a policy
    if "transport_encryption" not in server_app.config.get("MappingKernelManager", {}):
        server_app.kernel_manager.transport_encryption = "auto"
    if port_report.wanted:  # report waits for the server's bind, which initialize queues on the loop after this
        server_app.io_loop.add_callback(port_report.report, server_app)
