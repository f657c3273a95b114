"""`ClusterPanel`: pick nodes and GPUs, start/stop/restart the engines, watch the ranks, their telemetry and
the walltime. Outside any Slurm job it can also ask Slurm for an allocation of the kernel's own (as
``%hpc start --nodes N --time T`` does): that start runs in a thread, so the notebook stays usable while the job
waits, and Stop releases the job.

Controls and display only; every action is a call on the engines API, and its errors show in the panel.
The panel follows the engines' state whoever changes it (its buttons, or `%hpc` in another cell): it
subscribes to ``Engines`` and redraws on every change; the walltime ticks every second.
"""

from __future__ import annotations

import threading
from html import escape

import ipywidgets as w

from . import engines as engines_api
from .engines import Engines
from .engines.launch import usable
from .engines.output import COLLAPSE_ABOVE
from .engines.own_job import Request, waiting
from .engines.running_set import Rank
from .errors import HPCAIError
from .ranks import telemetry
from .scheduler.allocation import project_budget
from .scheduler.durations import format_duration

THIS_MACHINE, OWN_JOB = "this machine", "a Slurm job of its own"


class ClusterPanel(w.VBox):  # type: ignore[misc]
    """A panel over one kernel's engines (default: this kernel's, as `%hpc` uses)."""

    def __init__(self, engines: Engines | None = None, tick_seconds: float = 1) -> None:
        self.engines = engines or engines_api.current()
        alloc = self.engines.allocation
        max_nodes = len(alloc.nodes) if alloc else 1
        per_node = (alloc.gpus_per_node or max(1, alloc.tasks // max_nodes)) if alloc else 2
        style = {"description_width": "110px"}
        self.nodes = w.BoundedIntText(value=max_nodes, min=1, max=max_nodes, description="Nodes", style=style)
        self.gpus_per_node = w.BoundedIntText(value=per_node, min=1, max=per_node if alloc else 64,
                                              description="GPUs per node", style=style)
        launchers = usable(alloc)
        self.launcher = w.Dropdown(options=launchers, value=launchers[0], description="Launcher", style=style)
        # outside a job: where the engines go, and the allocation to ask for
        self.where = w.ToggleButtons(options=[THIS_MACHINE, OWN_JOB], value=THIS_MACHINE, description="Run on",
                                     style=style, layout=w.Layout(display="none" if alloc else ""))
        self.time = w.Text(value="1:00:00", description="Time", placeholder="30m, 2h or HH:MM:SS", style=style)
        self.partition = w.Text(description="Partition", placeholder="the default", style=style)
        self.account = w.Text(description="Account", placeholder="the default", style=style)
        self.ask_row = w.HBox([self.time, self.partition, self.account], layout=w.Layout(display="none"))
        self.where.observe(self._where_changed, names="value")
        self.start_button = w.Button(description="Start", button_style="success", icon="play")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop")
        self.restart_button = w.Button(description="Restart", icon="refresh")
        self.attach_button = w.Button(description="Attach", icon="link",
                                      tooltip="use engines running in this job already (an earlier kernel's)")
        self.grow_button = w.Button(description="+1 node", icon="plus",
                                    tooltip="ask Slurm for one more node (a second job); its ranks join this world")
        self.shrink_button = w.Button(description="-1 node", icon="minus",
                                      tooltip="stop the last node's ranks and give the node back to Slurm")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="Engines", style=style)
        self.state = w.HTML()
        self.ranks = w.HTML()
        self.walltime = w.HTML()
        self.message = w.HTML()
        self._alive: dict[int, bool] = {}  # by rank, as of the last change of state
        self.start_button.on_click(lambda _: self._on_start())
        self.stop_button.on_click(lambda _: self._act(self.engines.stop))
        self.restart_button.on_click(lambda _: self._act(lambda: self.engines.restart(progress=self._progress)))
        self.attach_button.on_click(lambda _: self._act(self.engines.attach))
        self.grow_button.on_click(lambda _: self._act(lambda: self.engines.grow(1, write=self._note)))
        self.shrink_button.on_click(lambda _: self._act(lambda: self._note(self.engines.shrink(nodes=1))))
        self.header = w.HTML()
        super().__init__([
            self.header,
            self.where,
            w.HBox([self.nodes, self.gpus_per_node, self.launcher]),
            self.ask_row,
            w.HBox([self.start_button, self.stop_button, self.restart_button, self.attach_button, self.grow_button,
                    self.shrink_button]),
            self.progress, self.state, self.ranks, self.walltime, self.message,
        ])
        self.refresh()
        self._unsubscribe = self.engines.subscribe(lambda engines: self.refresh())
        self._timer = _Repeat(tick_seconds, self._tick)
        self._timer.start()

    def _where_changed(self, change: dict[str, str]) -> None:
        """Asking for a job: any number of nodes, the srun launcher, and the request's fields."""
        own = change["new"] == OWN_JOB
        self.ask_row.layout.display = "" if own else "none"
        self.launcher.disabled = own
        self.nodes.max = 1024 if own else 1
        if not own:
            self.nodes.value = 1

    def _on_start(self) -> None:
        """Start here; or ask Slurm for a job, the wait in a thread (Start stays off until it ends: the engines
        refuse a second start meanwhile anyway)."""
        if self.where.value != OWN_JOB or self.engines.allocation:
            self._act(self._start)
            return
        asked: list[Request] = []
        self._act(lambda: asked.append(self._request()))  # a field Slurm would not read: its error shows
        if not asked:
            return
        ask = asked[0]
        self.start_button.disabled = self.attach_button.disabled = True
        threading.Thread(target=self._act, name="hpcai-panel-start", daemon=True, args=(
            lambda: self.engines.start(nodes=ask.nodes, gpus_per_node=ask.gpus_per_node, ask=ask,
                                       progress=self._progress),)).start()

    def _start(self) -> None:
        self.engines.start(nodes=self.nodes.value, gpus_per_node=self.gpus_per_node.value,
                           launcher=self.launcher.value, progress=self._progress)

    def _request(self) -> Request:
        """The allocation the fields ask for (a clear error for a time Slurm would not read)."""
        from argparse import ArgumentTypeError

        from .magic_args import duration  # the same durations as %hpc start --time

        try:
            seconds = duration(self.time.value.strip())
        except ArgumentTypeError as err:
            raise HPCAIError(f"Time: {err}", "how long the job holds the nodes: e.g. 30m, 2h or 1:00:00") from None
        return Request(self.nodes.value, self.gpus_per_node.value, seconds, self.partition.value.strip() or None,
                       self.account.value.strip() or None)

    def _progress(self, registered: int, wanted: int) -> None:
        self.progress.max, self.progress.value = wanted, registered

    def _note(self, text: str) -> None:
        """A line of what an action did (the grow's estimate, the shrink's outcome) under the table."""
        self.message.value += f'<div class="hpcai-note">{escape(text.strip())}</div>'

    def _act(self, action: object) -> None:
        self.message.value = ""
        for button in (self.start_button, self.stop_button, self.restart_button, self.attach_button,
                       self.grow_button, self.shrink_button):
            button.disabled = True
        try:
            action()  # type: ignore[operator]
        except HPCAIError as err:
            hint = f"<br><i>{escape(err.hint)}</i>" if err.hint else ""
            self.message.value = f'<div class="hpcai-error" style="color:#b00020">{escape(err.message)}{hint}</div>'
        finally:
            self.refresh()

    def refresh(self) -> None:
        """Redraw from the engines' state: the job, buttons, state, rank table, walltime."""
        alloc = self.engines.allocation  # the kernel's own job once it runs
        job = f"job {alloc.job_id} on {', '.join(alloc.nodes)}" if alloc else "no Slurm job: local engines"
        own = " (this kernel's own)" if self.engines.own_job and alloc else ""
        budget = project_budget() if alloc else None
        left = (f"; project {budget['account']}: {budget['gpu_hours_left']:.1f} of {budget['gpu_hours']:.0f} GPU hours"
                " left") if budget else ""
        self.header.value = f"<b>HPC engines</b> &mdash; {escape(job + own + left)}"
        state = self.engines.state
        busy = state in ("pending", "starting", "restarting", "stopping")
        self.start_button.disabled = self.attach_button.disabled = busy or state == "running"
        self.stop_button.disabled = (busy and state != "pending") or state == "stopped"  # Stop releases a waiting job
        self.restart_button.disabled = busy or self.engines.layout is None
        changeable = state == "running" and alloc is not None and self.engines.layout is not None \
            and self.engines.layout.launcher == "srun"
        self.grow_button.disabled = self.shrink_button.disabled = not changeable
        label = {"pending": "waiting for Slurm", "starting": "starting&hellip;", "restarting": "restarting&hellip;",
                 "stopping": "stopping&hellip;"}
        self.state.value = (f'<span class="hpcai-state" data-state="{state}">Engines: <b>{label.get(state, state)}</b>'
                            f'{escape(self._waiting())}</span>')
        self._alive = {r.rank: r.alive for r in self.engines.status()} if state == "running" else {}
        self.progress.max, self.progress.value = max(1, len(self._alive)), sum(self._alive.values())
        self._tick()

    def _waiting(self) -> str:
        """While the kernel's own job waits: its id, Slurm's reason and expected start."""
        info, job = self.engines.pending, self.engines.own_job
        if self.engines.state != "pending" or not info or not job:
            return ""
        return f" Slurm job {job.job_id} {waiting(info)}"

    def _tick(self) -> None:
        """Every second: the walltime, and the rank table with the ranks' latest telemetry (read from files,
        so this thread never touches the engines' client)."""
        self._show_ranks()
        self._show_walltime()

    def _show_ranks(self) -> None:
        ranks = [r for r in self.engines.ranks if r.rank in self._alive]
        if not ranks:
            self.ranks.value = "<i>no engines running</i>"
            return
        if len(ranks) > COLLAPSE_ABOVE:
            self._show_nodes(ranks)
            return
        samples = {row[0]: row for row in telemetry.rows(self.engines.samples())}
        head = "".join(f"<th>{c}</th>" for c in ("rank", "host", "GPU", "job", "state", *telemetry.COLUMNS[2:]))
        body = []
        for r in ranks:
            row = samples.get(str(r.rank), ("",) * len(telemetry.COLUMNS))
            cells = [str(r.rank), r.host, r.gpu or "-", r.job or "-", "running" if self._alive[r.rank] else "dead",
                     *row[2:]]
            flagged = (' class="hpcai-straggler" style="color:#b00020"'
                       if telemetry.alarming(row[-1]) or not self._alive[r.rank] else "")
            body.append(f"<tr{flagged}>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
        self.ranks.value = f'<table class="hpcai-ranks"><tr>{head}</tr>{"".join(body)}</table>'

    def _show_nodes(self, ranks: list[Rank]) -> None:
        """A large world's table: one row per node, its readings as min/median/max (%hpc top --node N: its ranks)."""
        rows = telemetry.node_table([(r.rank, r.host, self._alive[r.rank]) for r in ranks], self.engines.samples())
        head = "".join(f"<th>{c}</th>" for c in telemetry.NODE_TABLE_COLUMNS)
        body = [("<tr{}>".format(' class="hpcai-straggler" style="color:#b00020"' if telemetry.alarming(row[-1]) else "")
                 + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>") for row in rows]
        self.ranks.value = f'<table class="hpcai-ranks"><tr>{head}</tr>{"".join(body)}</table>'

    def _show_walltime(self) -> None:
        alloc = self.engines.allocation
        left = alloc.seconds_left() if alloc else None
        self.walltime.value = "" if left is None else f"Walltime left: <b>{format_duration(int(left))}</b>"

    def close(self) -> None:
        self._timer.cancel()
        self._unsubscribe()
        super().close()


class _Repeat(threading.Thread):
    """Call ``action`` every ``seconds`` until cancelled (a daemon thread)."""

    def __init__(self, seconds: float, action: object) -> None:
        super().__init__(daemon=True)
        self.seconds, self.action, self._stop = seconds, action, threading.Event()

    def run(self) -> None:
        while not self._stop.wait(self.seconds):
            self.action()  # type: ignore[operator]

    def cancel(self) -> None:
        self._stop.set()
