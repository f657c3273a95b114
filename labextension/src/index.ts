/**
 * jupyter-hpcai side panel: the Slurm job this server runs in, a walltime countdown with a
 * warning before the end, and the engines the user's kernels started. Data comes from the
 * server extension's /hpcai/api/allocation and /hpcai/api/engines.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

interface IAllocation {
  in_job: boolean;
  job_id?: string;
  partition?: string;
  nodes?: string[];
  gpus_per_node?: number;
  cpus_per_node?: number;
  seconds_left?: number | null;
}

interface IEngineSet {
  cluster_id: string;
  engines: number;
  registered: number;
  launcher: string | null;
  state: string;
}

const REFRESH_MS = 10000;
const WARN_SECONDS = 15 * 60;

async function getJSON<T>(path: string): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const response = await ServerConnection.makeRequest(URLExt.join(settings.baseUrl, path), {}, settings);
  if (!response.ok) {
    throw new Error(`${path}: ${response.status} ${response.statusText}`);
  }
  return (await response.json()) as T;
}

export function formatSeconds(total: number): string {
  const s = Math.max(0, Math.floor(total));
  const pad = (n: number) => String(n).padStart(2, '0');
  const days = Math.floor(s / 86400);
  const clock = `${pad(Math.floor((s % 86400) / 3600))}:${pad(Math.floor((s % 3600) / 60))}:${pad(s % 60)}`;
  return days ? `${days}-${clock}` : clock;
}

function escape(text: string): string {
  const div = document.createElement('div');
  div.textContent = text;
  return div.innerHTML;
}

class AllocationPanel extends Widget {
  private _allocation: IAllocation | null = null;
  private _engines: IEngineSet[] = [];
  private _error = '';
  private _deadline = 0; // ms since epoch when the walltime ends
  private _warned = false;
  private _timers: number[] = [];

  constructor() {
    super();
    this.id = 'hpcai-panel';
    this.addClass('hpcai-panel');
    this.title.label = 'HPC';
    this.title.caption = 'Slurm allocation and engines';
  }

  protected onAfterAttach(): void {
    void this.refresh();
    this._timers.push(window.setInterval(() => void this.refresh(), REFRESH_MS));
    this._timers.push(window.setInterval(() => this.tick(), 1000));
  }

  protected onBeforeDetach(): void {
    this._timers.forEach(t => window.clearInterval(t));
    this._timers = [];
  }

  async refresh(): Promise<void> {
    try {
      this._allocation = await getJSON<IAllocation>('hpcai/api/allocation');
      this._engines = (await getJSON<{ engine_sets: IEngineSet[] }>('hpcai/api/engines')).engine_sets;
      const left = this._allocation.seconds_left;
      this._deadline = typeof left === 'number' ? Date.now() + left * 1000 : 0;
      this._error = '';
    } catch (err) {
      this._error = String(err);
    }
    this.render();
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
      parts.push(`<p class="hpcai-warning">Cannot reach the server: ${escape(this._error)}</p>`);
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
    }
    parts.push('<h2>Engines</h2>');
    if (!this._engines.length) {
      parts.push('<p class="hpcai-muted">No engines. Start them in a notebook with <code>%hpc start</code>.</p>');
    } else {
      parts.push(
        '<table class="hpcai-engines"><tr><th>cluster</th><th>engines</th><th>state</th></tr>' +
          this._engines
            .map(
              e =>
                `<tr><td>${escape(e.cluster_id)}</td><td>${e.registered}/${e.engines}</td><td>${escape(e.state)}</td></tr>`
            )
            .join('') +
          '</table>'
      );
    }
    this.node.innerHTML = parts.join('');
    this.tick();
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
