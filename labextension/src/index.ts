/**
 * jupyter-hpcai side panel: the Slurm job this server runs in, a walltime countdown with a
 * warning before the end, and the engines the user's kernels started: a row per rank with its
 * telemetry and a sparkline, stragglers flagged, and a button that shows every rank's stack.
 * Data comes from the server extension's /hpcai/api/allocation, /hpcai/api/engines and
 * /hpcai/api/stacks, every 2 s.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { escape } from './escape';

interface IAllocation {
  in_job: boolean;
  job_id?: string;
  partition?: string;
  nodes?: string[];
  gpus_per_node?: number;
  cpus_per_node?: number;
  seconds_left?: number | null;
  walltime_signal?: number | null; // when Slurm's signal before the walltime came (s since epoch)
  walltime_warning?: number; // how long before the walltime it is sent (0: it is not)
  // the project's GPU budget where the site keeps one (GrpTRESMins on GPUs), read by the server every few minutes
  budget?: { account: string; gpu_hours: number; gpu_hours_left: number } | null;
}

interface IRecentJob {
  job_id: string;
  state: string;
  said: string; // how it ended, in words, with the advice that fits
}

interface ITelemetry {
  cpu: number;
  rss: number;
  gpu_util: number | null;
  gpu_mem: number | null;
  rate: number | null;
  cpu_history: number[];
  rate_history: number[];
  fresh: boolean;
  straggler: boolean;
}

interface IRank {
  rank: number;
  host: string;
  gpu: string;
  pid: number;
  alive: boolean;
  telemetry: ITelemetry | null;
}

interface IEngineSet {
  cluster_id: string;
  engines: number;
  registered: number;
  launcher: string | null;
  state: string;
  attached: boolean;
  ranks: IRank[];
  nodes?: INodeRow[]; // above 8 ranks: a row per node, which the panel shows instead of a row per rank
}

/** One node of a large world (the server's telemetry.node_table; readings as min/median/max over its ranks). */
interface INodeRow {
  node: string;
  ranks: string;
  running: string;
  'CPU %': string;
  RSS: string;
  'GPU %': string;
  'GPU mem': string;
  'rate /s': string;
  note: string;
}

interface IStackGroup {
  ranks: number[];
  headline: string;
  text: string;
}

const REFRESH_MS = 2000;
const MAX_FLAGGED = 16; // flagged ranks shown each in full under a large world's node rows
const RECENT_JOBS_MS = 60000; // the recent jobs' ends: the server reads Slurm's accounting once a minute at most
const WARN_SECONDS = 15 * 60;
// What the hub's proxy answers once the single-user server is gone (424: not running; 502/503: going away)
const SERVER_GONE = new Set([424, 502, 503]);

class RequestError extends Error {
  constructor(
    readonly path: string,
    readonly status: number,
    readonly body: { error?: string; hint?: string } = {}
  ) {
    super(body.error ?? `${path}: HTTP ${status}`);
  }
}

async function requestJSON<T>(path: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(URLExt.join(settings.baseUrl, path), init, settings);
  } catch {
    throw new RequestError(path, 0); // no answer at all: the server (or its node) is gone
  }
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new RequestError(path, response.status, body);
  }
  return (await response.json()) as T;
}

/** Why the panel cannot show anything, in words. */
export function describeFailure(err: unknown): string {
  if (err instanceof RequestError && (err.status === 0 || SERVER_GONE.has(err.status))) {
    return (
      'The notebook server has stopped: its Slurm job ended (the walltime ran out, or it was cancelled), or ' +
      'the server was shut down. Your files are kept; start a new server from the hub home page.'
    );
  }
  return `The server did not answer as expected: ${String(err instanceof Error ? err.message : err)}`;
}

/** A small SVG line of the last values (oldest first), scaled to their maximum. */
export function sparkline(values: number[], width = 60, height = 14): string {
  if (values.length < 2) {
    return '';
  }
  const top = Math.max(...values, 1e-9);
  const step = width / (values.length - 1);
  const points = values
    .map((v, i) => `${(i * step).toFixed(1)},${(height - (v / top) * (height - 2) - 1).toFixed(1)}`)
    .join(' ');
  return (
    `<svg class="hpcai-spark" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">` +
    `<polyline fill="none" stroke="currentColor" stroke-width="1.2" points="${points}"/></svg>`
  );
}

function size(bytes: number | null): string {
  if (bytes === null) {
    return '-';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let n = bytes;
  let unit = 0;
  while (n >= 1024 && unit < units.length - 1) {
    n /= 1024;
    unit++;
  }
  return unit ? `${n.toFixed(1)} ${units[unit]}` : `${n} B`;
}

export function formatSeconds(total: number): string {
  const s = Math.max(0, Math.floor(total));
  const pad = (n: number) => String(n).padStart(2, '0');
  const days = Math.floor(s / 86400);
  const clock = `${pad(Math.floor((s % 86400) / 3600))}:${pad(Math.floor((s % 3600) / 60))}:${pad(s % 60)}`;
  return days ? `${days}-${clock}` : clock;
}


class AllocationPanel extends Widget {
  private _allocation: IAllocation | null = null;
  private _engines: IEngineSet[] = [];
  private _stacks = new Map<string, string>(); // by engine set: the last stacks shown, or why there are none
  private _error = '';
  private _deadline = 0; // ms since epoch when the walltime ends
  private _warned = false;
  private _signalSaid = false;
  private _extendSaid = ''; // what the last Extend request got: the new limit, or the site's reason
  private _timers: number[] = [];
  private _refreshing = false;
  private _recent: IRecentJob[] = [];

  constructor() {
    super();
    this.id = 'hpcai-panel';
    this.addClass('hpcai-panel');
    this.title.label = 'HPC';
    this.title.caption = 'Slurm allocation and engines';
  }

  protected onAfterAttach(): void {
    void this.refresh();
    void this.readRecentJobs();
    this._timers.push(window.setInterval(() => void this.refresh(), REFRESH_MS));
    this._timers.push(window.setInterval(() => void this.readRecentJobs(), RECENT_JOBS_MS));
    this._timers.push(window.setInterval(() => this.tick(), 1000));
  }

  protected onBeforeDetach(): void {
    this._timers.forEach(t => window.clearInterval(t));
    this._timers = [];
  }

  async refresh(): Promise<void> {
    if (this._refreshing) {
      return; // a slow server: the next tick asks again, requests never pile up
    }
    this._refreshing = true;
    try {
      this._allocation = await requestJSON<IAllocation>('hpcai/api/allocation');
      this._engines = (await requestJSON<{ engine_sets: IEngineSet[] }>('hpcai/api/engines')).engine_sets;
      const left = this._allocation.seconds_left;
      this._deadline = typeof left === 'number' ? Date.now() + left * 1000 : 0;
      this._error = '';
      this.sayWalltimeSignal();
    } catch (err) {
      this._error = describeFailure(err);
    } finally {
      this._refreshing = false;
    }
    this.render();
  }

  /** How the user's jobs of the last week ended (Slurm's accounting); nothing where the site keeps none. */
  async readRecentJobs(): Promise<void> {
    try {
      this._recent = (await requestJSON<{ jobs: IRecentJob[] }>('hpcai/api/recent-jobs')).jobs;
    } catch {
      this._recent = []; // the panel's other parts say what is wrong with the server
    }
    this.render();
  }

  /** Every rank's Python stack in one set, identical stacks grouped (py-spy on the nodes, else each rank's own
   * thread), and who read them. */
  async showStacks(clusterId: string): Promise<void> {
    this._stacks.set(clusterId, 'Reading every rank\'s stack...');
    this.render();
    try {
      const reply = await requestJSON<{ groups: IStackGroup[]; read: string }>('hpcai/api/stacks', {
        method: 'POST',
        body: JSON.stringify({ cluster_id: clusterId, native: false })
      });
      this._stacks.set(clusterId, [...reply.groups.map(g => g.text), reply.read].join('\n'));
    } catch (err) {
      const body = err instanceof RequestError ? err.body : {};
      this._stacks.set(clusterId, body.error ? `${body.error}\n${body.hint ?? ''}` : describeFailure(err));
    }
    this.render();
  }

  /** Stop one engine set (one no kernel uses any more, say): its ranks and controller. */
  async stopSet(clusterId: string): Promise<void> {
    this._stacks.set(clusterId, 'Stopping...');
    this.render();
    try {
      await requestJSON('hpcai/api/engines/stop', { method: 'POST', body: JSON.stringify({ cluster_id: clusterId }) });
      this._stacks.delete(clusterId);
    } catch (err) {
      const body = err instanceof RequestError ? err.body : {};
      this._stacks.set(clusterId, body.error ? `${body.error}\n${body.hint ?? ''}` : describeFailure(err));
    }
    await this.refresh();
  }

  /** Ask the hub for more walltime (the site's policy decides); the answer stays under the countdown. */
  async extend(seconds: number): Promise<void> {
    this._extendSaid = 'Asking the hub...';
    this.render();
    try {
      const granted = await requestJSON<{ time_limit: string; end_time: string }>('hpcai/api/extend', {
        method: 'POST',
        body: JSON.stringify({ seconds })
      });
      this._extendSaid = `Extended: time limit ${granted.time_limit}, ends ${granted.end_time.replace('T', ' ')}.`;
      this._warned = false; // the countdown warns again before the new end
    } catch (err) {
      const body = err instanceof RequestError ? err.body : {};
      this._extendSaid = body.error ? `Not extended: ${body.error}. ${body.hint ?? ''}` : describeFailure(err);
    }
    await this.refresh();
  }

  /** Once, when Slurm's walltime signal has reached the job: the notebook's hooks are checkpointing now. */
  private sayWalltimeSignal(): void {
    if (!this._allocation?.walltime_signal || this._signalSaid) {
      return;
    }
    this._signalSaid = true;
    const left = this._deadline ? formatSeconds((this._deadline - Date.now()) / 1000) : 'little time';
    Notification.warning(
      `Slurm job ${this._allocation.job_id} reaches its walltime in ${left}: the walltime signal came. ` +
        "The ranks' walltime hooks (hpc.on_walltime) run now; save your work.",
      { autoClose: false }
    );
  }

  private tick(): void {
    const clock = this.node.querySelector('.hpcai-walltime');
    if (!clock || !this._deadline) {
      return;
    }
    const left = (this._deadline - Date.now()) / 1000;
    clock.textContent = formatSeconds(left);
    clock.classList.toggle('hpcai-warning', left < WARN_SECONDS);
    if (left < WARN_SECONDS && !this._warned) {
      this._warned = true;
      Notification.warning(
        `Slurm job ${this._allocation?.job_id}: ${formatSeconds(left)} of walltime left. Save your work; ` +
          'the job and its engines end with the walltime.',
        { autoClose: false }
      );
    }
  }

  private render(): void {
    const a = this._allocation;
    const parts: string[] = ['<h2>Slurm allocation</h2>'];
    if (this._error) {
      parts.push(`<p class="hpcai-warning hpcai-stopped">${escape(this._error)}</p>`);
      this.node.innerHTML = parts.join('');
      return;
    } else if (!a) {
      parts.push('<p class="hpcai-muted">Loading...</p>');
    } else if (!a.in_job) {
      parts.push(
        '<p class="hpcai-not-in-job">This Jupyter server is not running inside a Slurm job, so there is no ' +
          'allocation to show. Start it from the hub with a GPU profile to get nodes and GPUs.</p>'
      );
    } else {
      const rows: [string, string][] = [
        ['Job', a.job_id ?? ''],
        ['Partition', a.partition ?? ''],
        ['Nodes', `${(a.nodes ?? []).length} (${(a.nodes ?? []).join(', ')})`],
        ['GPUs per node', String(a.gpus_per_node ?? 0)]
      ];
      if (a.budget) {
        rows.push([
          'GPU hours left',
          `${a.budget.gpu_hours_left.toFixed(1)} of ${a.budget.gpu_hours.toFixed(0)} (project ${a.budget.account})`
        ]);
      }
      parts.push(
        '<table class="hpcai-job">' +
          rows.map(([k, v]) => `<tr><th>${k}</th><td>${escape(v)}</td></tr>`).join('') +
          '</table>'
      );
      parts.push(
        this._deadline
          ? `<p>Walltime left: <span class="hpcai-walltime">${formatSeconds((this._deadline - Date.now()) / 1000)}</span></p>`
          : '<p class="hpcai-muted">No time limit.</p>'
      );
      if (this._deadline) {
        parts.push(
          '<p><button class="hpcai-extend-button" title="Ask the hub for 30 more minutes (the site\'s policy ' +
            'decides)">Extend 30 min</button></p>'
        );
      }
      if (this._extendSaid) {
        parts.push(`<p class="hpcai-extend-result">${escape(this._extendSaid)}</p>`);
      }
      if (a.walltime_signal) {
        const at = new Date(a.walltime_signal * 1000).toLocaleTimeString();
        parts.push(
          `<p class="hpcai-warning hpcai-walltime-signal">Walltime signal at ${escape(at)}: ` +
            "the ranks' walltime hooks run; the job ends soon.</p>"
        );
      }
    }
    parts.push('<h2>Engines</h2>');
    if (!this._engines.length) {
      parts.push('<p class="hpcai-muted">No engines. Start them in a notebook with <code>%hpc start</code>.</p>');
    }
    for (const e of this._engines) {
      parts.push(
        `<p class="hpcai-set">${escape(e.cluster_id)}: ${e.registered}/${e.engines} ${escape(e.state)}` +
          (e.launcher ? ` (${escape(e.launcher)})` : '') +
          ` <button class="hpcai-stacks-button" data-cluster="${escape(e.cluster_id)}"` +
          ' title="Every rank\'s Python stack, identical ones grouped">Stacks</button>' +
          ` <button class="hpcai-stop-button" data-cluster="${escape(e.cluster_id)}"` +
          ' title="Stop these engines (every kernel using them loses them)">Stop</button></p>'
      );
      if (e.state === 'running' && !e.attached) {
        parts.push(
          '<p class="hpcai-detached">No kernel uses these engines (their kernel restarted or ended); what the ranks ' +
            `hold is still there: <code>%hpc attach ${escape(e.cluster_id)}</code> in a notebook, or Stop.</p>`
        );
      }
      parts.push(e.nodes ? this.nodeTable(e.nodes, e.ranks) : this.rankTable(e.ranks));
      const stacks = this._stacks.get(e.cluster_id);
      if (stacks !== undefined) {
        parts.push(`<pre class="hpcai-stacks">${escape(stacks)}</pre>`);
      }
    }
    if (this._recent.length) {
      parts.push(
        '<h3>Recent jobs</h3><ul class="hpcai-recent-jobs">' +
          this._recent.map(j => `<li data-state="${escape(j.state)}">${escape(j.said)}</li>`).join('') +
          '</ul>'
      );
    }
    this.node.innerHTML = parts.join('');
    const extend = this.node.querySelector<HTMLButtonElement>('.hpcai-extend-button');
    if (extend) {
      extend.onclick = () => void this.extend(30 * 60);
    }
    this.node.querySelectorAll<HTMLButtonElement>('.hpcai-stacks-button').forEach(button => {
      button.onclick = () => void this.showStacks(button.dataset.cluster ?? '');
    });
    this.node.querySelectorAll<HTMLButtonElement>('.hpcai-stop-button').forEach(button => {
      button.onclick = () => void this.stopSet(button.dataset.cluster ?? '');
    });
    this.tick();
  }

  private rankTable(ranks: IRank[]): string {
    return (
      '<table class="hpcai-engines"><tr><th>rank</th><th>host</th><th>GPU</th><th>pid</th><th>state</th></tr>' +
      ranks.map(r => this.rankRow(r)).join('') +
      '</table>'
    );
  }

  /** A large world: a row per node (two, to fit a narrow panel), then the flagged ranks (dead, straggling or
   * silent) each in full, so that the one straggler in 128 is on the screen. */
  private nodeTable(nodes: INodeRow[], ranks: IRank[]): string {
    const rows = nodes.map(n => {
      const flagged = /straggler|no sample|dead/.test(n.note) ? ' hpcai-flagged' : '';
      const detail = n['CPU %'] === '-' ? 'no telemetry yet' : [
        `CPU ${n['CPU %']}%`,
        n.RSS,
        n['GPU %'] === '-' ? 'GPU -' : `GPU ${n['GPU %']}% ${n['GPU mem']}`,
        ...(n['rate /s'] === '-' ? [] : [`${n['rate /s']}/s`])
      ].join(' · ');
      return (
        `<tr class="hpcai-node${flagged}"><td>${escape(n.node)}</td><td colspan="2">ranks ${escape(n.ranks)}</td>` +
        `<td colspan="2">${escape(n.running)} running</td></tr>` +
        `<tr class="hpcai-telemetry${flagged}"><td colspan="5">${escape(detail)}` +
        (n.note ? `<br>${escape(n.note)}` : '') +
        '</td></tr>'
      );
    });
    const flagged = ranks.filter(r => !r.alive || r.telemetry?.straggler || (r.telemetry && !r.telemetry.fresh));
    return (
      `<p class="hpcai-muted">${ranks.length} ranks on ${nodes.length} node${nodes.length === 1 ? '' : 's'}: ` +
      'a row per node, each reading ' +
      'min/median/max over its ranks.</p>' +
      '<table class="hpcai-engines hpcai-nodes"><tr><th>node</th><th colspan="2">ranks</th>' +
      '<th colspan="2">state</th></tr>' +
      rows.join('') +
      '</table>' +
      (flagged.length ? '<h3>Flagged ranks</h3>' + this.rankTable(flagged.slice(0, MAX_FLAGGED)) : '') +
      (flagged.length > MAX_FLAGGED ? `<p class="hpcai-muted">and ${flagged.length - MAX_FLAGGED} more</p>` : '')
    );
  }

  /** Two rows per rank, to fit a narrow panel: who it is, then its telemetry with a sparkline. */
  private rankRow(r: IRank): string {
    const t = r.telemetry;
    const flagged = !r.alive || t?.straggler ? ' hpcai-flagged' : '';
    const who = [String(r.rank), r.host, r.gpu || '-', String(r.pid), r.alive ? 'running' : 'dead'];
    let detail = escape('no telemetry yet');
    if (t) {
      const gpu = t.gpu_util === null ? 'GPU -' : `GPU ${t.gpu_util.toFixed(0)}% ${size(t.gpu_mem)}`;
      const rate = t.rate === null ? '' : ` · ${t.rate.toFixed(1)}/s`;
      const note = t.straggler ? ' · straggler' : t.fresh ? '' : ' · no recent sample';
      const history = t.rate_history.length > 1 ? t.rate_history : t.cpu_history;
      detail = `${escape(`CPU ${t.cpu.toFixed(0)}% · ${size(t.rss)} · ${gpu}${rate}${note}`)} ${sparkline(history)}`;
    }
    return (
      `<tr class="hpcai-rank${flagged}">` +
      who.map(c => `<td>${escape(c)}</td>`).join('') +
      `</tr><tr class="hpcai-telemetry${flagged}"><td colspan="5">${detail}</td></tr>`
    );
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-hpcai:panel',
  description: 'The Slurm allocation, walltime and engines of this server.',
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    app.shell.add(new AllocationPanel(), 'left', { rank: 900 });
  }
};

export default plugin;
