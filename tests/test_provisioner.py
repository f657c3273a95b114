"""The hpcai-env provisioner: kernels start inside their env, fully activated, and fail fast when broken."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import pytest
from jupyter_client.manager import KernelManager
from jupyter_core.paths import jupyter_runtime_dir

from jupyter_hpcai import kernelspec
from jupyter_hpcai.scheduler import slurm
from jupyter_hpcai.scheduler.interface import TERMINAL_STATES
from jupyter_hpcai.envs import Builder, EnvDir, EnvStore, load_recipe, open_env
from jupyter_hpcai.provisioner import KernelEnvError
from jupyter_hpcai.proc import wait_until
from helpers.jupyter import execute, jupyter_server, wait_for_stream

PROBE = "import os, sys; print(sys.prefix, os.environ['HPCAI_TEST_ACTIVATED'], os.environ['HPCAI_TEST_MODULE'], " \
        "os.environ['PATH'].split(':')[:3])"


def _run(kc, code: str, timeout: float = 60) -> tuple[str, dict]:  # type: ignore[no-untyped-def]
    out: list[str] = []
    reply = kc.execute_interactive(code, timeout=timeout, stop_on_error=False,  # see conftest JobKernel.run
                                   output_hook=lambda m: out.append(m["content"].get("text", ""))
                                   if m["msg_type"] == "stream" else None)
    return "".join(out), reply["content"]


def test_kernel_sees_activation_and_module(kernel_env: EnvDir) -> None:
    km = KernelManager(kernel_name=kernelspec.kernel_name(kernel_env))
    km.start_kernel()
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        out, reply = _run(kc, PROBE)
        assert reply["status"] == "ok"
        prefix, activated, module, path = out.split(" ", 3)
        assert Path(prefix).resolve() == kernel_env.current().prefix.resolve()  # type: ignore[union-attr]
        assert (activated, module) == ("yes", "loaded")
        assert "opt/hpcai-test/bin" in path and "/opt/hpcai-test-module/bin" in path  # activate.d and module

        # interrupt a kernel running a cell
        msg_id = kc.execute("import time; print('sleeping', flush=True); time.sleep(120)",
                            stop_on_error=False)  # see conftest JobKernel.run
        wait_for_stream(kc, "sleeping")
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=30)
        assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["ename"] == "KeyboardInterrupt"

        # restart: a fresh, still activated kernel
        _run(kc, "marker = 1")
        km.restart_kernel(now=True)
        kc.wait_for_ready(timeout=60)
        out, reply = _run(kc, "print('marker' in dir(), __import__('os').environ['HPCAI_TEST_MODULE'])")
        assert out.split() == ["False", "loaded"]
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=False)
    assert not km.is_alive()


def test_kernel_through_a_real_jupyter_server(kernel_env: EnvDir, tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        status, kernel = server.request("POST", "/api/kernels", {"name": kernelspec.kernel_name(kernel_env)})
        assert status == 201, kernel
        result = asyncio.run(execute(server, kernel["id"], PROBE))
        assert result["status"] == "ok" and " yes loaded " in result["stdout"]
        connection = json.loads((Path(jupyter_runtime_dir()) / f"kernel-{kernel['id']}.json").read_text())
        assert connection["curve_publickey"] and connection["curve_secretkey"]  # the connection is encrypted
        assert server.request("DELETE", f"/api/kernels/{kernel['id']}")[0] == 204
    log = server.log.read_text()  # the kernel's own warnings land in the server's log
    assert "without encryption" not in log, log[-3000:]


def test_kernel_in_a_slurm_job_keeps_its_gpus(devcluster, kernel_env: EnvDir, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A kernel started inside an sbatch job sees the job's fake GPUs and the allocation API reads the job."""
    probe = tmp_path / "probe.py"
    probe.write_text(f"""
import json, os
from jupyter_client.manager import KernelManager
from jupyter_core.paths import jupyter_runtime_dir
from jupyter_hpcai.scheduler.allocation import Allocation
km = KernelManager(kernel_name={kernelspec.kernel_name(kernel_env)!r})
km.start_kernel()
kc = km.client(); kc.start_channels(); kc.wait_for_ready(timeout=60)
out = []
kc.execute_interactive("import os, json; print(json.dumps({{k: os.environ.get(k) for k in "
                       "('CUDA_VISIBLE_DEVICES', 'SLURM_JOB_ID', 'HPCAI_TEST_ACTIVATED')}}))",
                       output_hook=lambda m: out.append(m['content'].get('text', '')) if m['msg_type'] == 'stream' else None)
km.shutdown_kernel()
print(json.dumps({{"job": {{"CUDA_VISIBLE_DEVICES": os.environ["CUDA_VISIBLE_DEVICES"], "SLURM_JOB_ID": os.environ["SLURM_JOB_ID"]}},
                  "kernel": json.loads("".join(out)), "allocation": Allocation.current().to_json()}}))
""")
    output = tmp_path / "job.out"
    job = slurm.submit(["-N1", "--gpus-per-node=2", "--time=00:10:00", f"--output={output}",
                        "--wrap", f"{sys.executable} {probe}"])
    state = wait_until(lambda: (slurm.job_info(job) or {}).get("JobState") in TERMINAL_STATES
                       and slurm.job_info(job)["JobState"], timeout=180, what=f"job {job} to end")  # type: ignore[index]
    assert state == "COMPLETED", output.read_text()
    report = json.loads(output.read_text().strip().splitlines()[-1])
    assert report["kernel"]["CUDA_VISIBLE_DEVICES"] == report["job"]["CUDA_VISIBLE_DEVICES"]
    assert len(report["kernel"]["CUDA_VISIBLE_DEVICES"].split(",")) == 2
    assert report["kernel"]["SLURM_JOB_ID"] == str(job) and report["kernel"]["HPCAI_TEST_ACTIVATED"] == "yes"
    alloc = report["allocation"]
    assert (alloc["job_id"], alloc["gpus_per_node"], len(alloc["nodes"]), alloc["partition"]) == (str(job), 2, 1, "gpu")
    assert 0 < alloc["seconds_left"] <= 600


# -- broken envs: fail fast with the env, the failing step and the fix ------------------------------

def _start_fails(spec: dict, tmp_path: Path) -> str:  # type: ignore[type-arg]
    """Start a kernel from an env's kernelspec (written, as `hpcai kernel install` would, before the env broke)
    and return the error."""
    spec_dir = tmp_path / "kernels" / "broken"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    from jupyter_client.kernelspec import KernelSpecManager

    km = KernelManager(kernel_name="broken", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")]))
    start = time.monotonic()
    with pytest.raises(KernelEnvError) as err:
        km.start_kernel()
    assert time.monotonic() - start < 15, "a broken env must fail fast, not hang"
    return str(err.value)


@pytest.fixture
def scratch_env(small_recipe: Path, env_store: EnvStore, request: pytest.FixtureRequest) -> EnvDir:
    return Builder(load_recipe(small_recipe), store=env_store, name=f"broken-{request.node.name[-12:]}").run().env_dir


def test_removed_env(scratch_env: EnvDir, env_store: EnvStore, tmp_path: Path) -> None:
    spec = kernelspec.render(open_env(scratch_env))
    open_env(scratch_env).remove()
    message = _start_fails(spec, tmp_path)
    assert f"no environment named '{scratch_env.name}'" in message and "hpcai env build" in message


def test_env_without_python(scratch_env: EnvDir, tmp_path: Path) -> None:
    spec = kernelspec.render(open_env(scratch_env))
    python = scratch_env.current().python  # type: ignore[union-attr]
    python.unlink()
    message = _start_fails(spec, tmp_path)
    assert f"env '{scratch_env.name}' is broken" in message and str(python) in message and "--rebuild" in message


def test_failing_activate_script(scratch_env: EnvDir, tmp_path: Path) -> None:
    script = scratch_env.current().prefix / "etc" / "conda" / "activate.d" / "zz-site.sh"  # type: ignore[union-attr]
    spec = kernelspec.render(open_env(scratch_env))
    script.write_text("echo 'site setup failed' >&2\nreturn 3\n")
    message = _start_fails(spec, tmp_path)
    assert f"activating env '{scratch_env.name}' failed" in message and "zz-site.sh failed (exit 3)" in message
    assert "hpcai env check" in message


def test_broken_env_error_reaches_the_server_api(scratch_env: EnvDir, tmp_path: Path) -> None:
    """JupyterLab's kernel error dialog shows what the server's API returns."""
    import os

    spec = kernelspec.render(open_env(scratch_env))
    scratch_env.current().python.unlink()  # type: ignore[union-attr]
    spec_root = tmp_path / "jupyter"
    (spec_root / "kernels" / "broken").mkdir(parents=True)
    (spec_root / "kernels" / "broken" / "kernel.json").write_text(json.dumps(spec))
    with jupyter_server(tmp_path, env={**os.environ, "JUPYTER_PATH": str(spec_root)}) as server:
        status, body = server.request("POST", "/api/kernels", {"name": "broken"})
    assert status == 500
    assert f"env '{scratch_env.name}' is broken" in body["message"] and "--rebuild" in body["message"]


def test_kernel_start_overhead(kernel_env: EnvDir, tmp_path: Path, bench: list[str]) -> None:
    """Benchmark (printed): start-to-ready through the provisioner against plain ipykernel, same env."""
    from jupyter_client.kernelspec import KernelSpecManager

    build = kernel_env.current()
    assert build is not None
    plain = tmp_path / "kernels" / "plain"
    plain.mkdir(parents=True)
    (plain / "kernel.json").write_text(json.dumps({"argv": [str(build.python), "-m", "ipykernel_launcher", "-f",
                                                            "{connection_file}"], "display_name": "plain", "language": "python"}))
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels"), *KernelSpecManager().kernel_dirs])

    def start_to_ready(name: str) -> float:
        km = KernelManager(kernel_name=name, kernel_spec_manager=ksm)
        start = time.monotonic()
        km.start_kernel()
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        seconds = time.monotonic() - start
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        return seconds

    times = {name: statistics.median(start_to_ready(name) for _ in range(3))
             for name in ("plain", kernelspec.kernel_name(kernel_env))}
    ratio = times[kernelspec.kernel_name(kernel_env)] / times["plain"]
    bench.append(f"kernel start-to-ready: provisioner {times[kernelspec.kernel_name(kernel_env)]:.2f} s / plain "
                 f"{times['plain']:.2f} s = {ratio:.2f} (target <= 1.3)")
