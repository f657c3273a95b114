"""The resource form on the spawn page: profiles (with Slurm's expected start), then the values a user may
adjust within the limits, and a link that fills the form with the current choices (the choices ride in the link's
fragment, which no server sees: following a link never starts a server, whoever sent it)."""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Mapping
from html import escape
from typing import Any

from tornado.web import HTTPError

from ..scheduler.interface import Associations
from . import compat
from .as_user import command_env
from .associations import describe_account, describe_qos

CHECK_KEPT_FOR = 60.0  # seconds the form's check of a start's options stands for the start that follows
from .options import FIELDS, Limit, OptionsError, Profile, SpawnOptions, merge_limits, validate

STYLE = """<style>
.hpcai-form .form-group{margin-bottom:.6em}.hpcai-form .hpcai-error{color:#b00020;font-weight:600}
.hpcai-form .form-text{font-size:90%;color:#555}
.hpcai-form .hpcai-note{border:1px solid #999;border-radius:4px;padding:.5em;margin-bottom:.8em}
</style>"""

# A profile's values fill the fields; the selected partition's limits and the selected profile's start estimate
# show under their selects; a field's error goes once the field changes; the link follows every field, and a link's
# choices (after '#') fill the fields as the page opens, the profile first.
SCRIPT = """<script>
(function(){
var form=document.querySelector('.hpcai-form');if(!form)return;
function byId(n){return document.getElementById('hpcai-'+n);}
function note(sel,target,key){var o=sel.selectedOptions[0];if(o&&target)target.textContent=o.dataset[key]||'';}
function share(){var q=new URLSearchParams();FIELDS.forEach(function(n){var e=byId(n);if(e&&e.value!=='')q.set(n,e.value);});
  var a=byId('share');a.href=location.origin+location.pathname+'#'+q.toString();a.textContent=a.href;}
function cleared(n){var e=byId('error-'+n);if(e)e.remove();}
var FIELDS=%s;
FIELDS.forEach(function(n){var e=byId(n);if(!e)return;['input','change'].forEach(function(ev){e.addEventListener(ev,function(){cleared(n);share();});});});
var p=byId('profile'),part=byId('partition');
p.addEventListener('change',function(){var d=JSON.parse(p.selectedOptions[0].dataset.values);
  for(var k in d){var e=byId(k);if(e&&e.value!==d[k]){e.value=d[k];cleared(k);}}
  note(p,byId('estimate'),'estimate');note(part,byId('partition-limits'),'limits');share();});
part.addEventListener('change',function(){note(part,byId('partition-limits'),'limits');});
['account','qos'].forEach(function(n){var e=byId(n);if(e&&e.tagName==='SELECT'){
  e.addEventListener('change',function(){note(e,byId(n+'-limits'),'limits');});note(e,byId(n+'-limits'),'limits');}});
var given=new URLSearchParams(location.hash.slice(1));
if(given.has('profile')){p.value=given.get('profile');p.dispatchEvent(new Event('change'));}
FIELDS.forEach(function(n){var e=byId(n);if(e&&n!=='profile'&&given.has(n))e.value=given.get(n);});
note(p,byId('estimate'),'estimate');note(part,byId('partition-limits'),'limits');share();
})();
</script>"""


FROM_LINK = "A link filled in this form; nothing has started. Check its choices (an account of yours pays), then press Start."


def render(profiles: list[Profile], limits: Mapping[str, Limit], environments: Mapping[str, str],
           values: Mapping[str, str] | None = None, errors: Mapping[str, str] | None = None,
           estimates: Mapping[str, str] | None = None, note: str = "", found: Associations | None = None,
           site_qos: str = "") -> str:
    """HTML for the form; ``values`` and ``errors`` re-show a rejected submission (or a link's choices) with a
    message per field; ``estimates``: profile name -> when Slurm expects its job to start, in words; ``note``: a line
    above the fields; ``found``: the user's associations (their accounts and QOS as selects), None where the site
    keeps no accounting (the account a text field, no QOS); ``site_qos``: the QOS the site sets (no QOS select)."""
    errors, estimates = errors or {}, estimates or {}
    first = profiles[0].model_dump() if profiles else {}
    values = {**{k: str(v) for k, v in first.items()}, **(values or {})}

    def err(name: str) -> str:
        return f'<div class="hpcai-error" id="hpcai-error-{name}">{escape(errors[name])}</div>' if name in errors else ""

    def field(name: str, label: str, control: str, note: str = "") -> str:
        return f'<div class="form-group"><label for="hpcai-{name}">{label}</label>{control}{note}{err(name)}</div>'

    def number(name: str, minimum: int) -> str:
        return (f'<input class="form-control" type="number" min="{minimum}" id="hpcai-{name}" name="{name}" '
                f'value="{escape(values.get(name, ""))}">')

    def select(name: str, choices: list[tuple[str, str, str]]) -> str:
        opts = "".join(f'<option value="{escape(v)}"{extra}{" selected" if v == values.get(name) else ""}>{escape(t)}</option>'
                       for v, t, extra in choices)
        return f'<select class="form-select" id="hpcai-{name}" name="{name}">{opts}</select>'

    def text(name: str) -> str:
        return f'<input class="form-control" id="hpcai-{name}" name="{name}" value="{escape(values.get(name, ""))}">'

    def profile_choice(p: Profile) -> tuple[str, str, str]:
        said = estimates.get(p.name, "")
        data = f" data-values='{escape(json.dumps(_defaults(p)))}' data-estimate=\"{escape(f'Slurm: {said}' if said else '')}\""
        return p.name, f"{p.name} ({said})" if said else p.name, data

    partition_choices = [(name, name, f' data-limits="{escape(limit.describe())}"') for name, limit in limits.items()]
    env_choices = [("", "(server default)", "")] + [(k, v, "") for k, v in environments.items()]
    parts = [
        STYLE, '<div class="hpcai-form">', f'<div class="hpcai-note" id="hpcai-note">{escape(note)}</div>' if note else "",
        field("profile", "Profile", select("profile", [profile_choice(p) for p in profiles]),
              '<div class="form-text" id="hpcai-estimate"></div>'),
        field("partition", "Partition", select("partition", partition_choices),
              '<div class="form-text" id="hpcai-partition-limits"></div>'),
        field("nodes", "Nodes", number("nodes", 1)),
        field("gpus_per_node", "GPUs per node", number("gpus_per_node", 0)),
        field("walltime", "Walltime (HH:MM:SS)", text("walltime")),
        *_account_fields(found, site_qos, select, text, field),
        field("environment", "Environment", select("environment", env_choices)),
        '<p class="form-text">A link to this form with these choices (it starts nothing): '
        '<a id="hpcai-share" href="#"></a></p>',
        "</div>", SCRIPT % json.dumps(list(FIELDS)),
    ]
    return "\n".join(parts)


def _account_fields(found: Associations | None, site_qos: str, select: Any, text: Any, field: Any) -> list[str]:
    """The account field (a select of the user's accounts, the default first, each with where it runs, its QOS and
    GPU hours left; a text field where the site keeps no accounting) and the QOS select (each QOS's limits)."""
    if found is None:
        return [field("account", "Account (optional)", text("account"))]
    accounts = [(a.name, f"{a.name} (default)" if i == 0 else a.name,
                 f' data-limits="{escape(describe_account(a))}"') for i, a in enumerate(found.accounts)]
    fields = [field("account", "Account", select("account", accounts),
                    '<div class="form-text" id="hpcai-account-limits"></div>')]
    if site_qos:
        return fields
    named = sorted({q for a in found.accounts for q in a.qos})
    qos = [("", "(the account's default)", "")] + [
        (q, q, f' data-limits="{escape(describe_qos(found.qos[q]))}"' if q in found.qos else "") for q in named]
    return [*fields, field("qos", "QOS", select("qos", qos), '<div class="form-text" id="hpcai-qos-limits"></div>')]


def _defaults(profile: Profile) -> dict[str, str]:
    return {k: str(v) for k, v in profile.model_dump(include={"partition", "nodes", "gpus_per_node", "walltime",
                                                              "account", "environment"}).items()}


class SpawnForm:
    """A mixin of HPCSlurmSpawner: the form rendered with the limits and the estimates, the form's or a link's values
    read, and a start's options validated once (``_valid``)."""

    # the form's last rejected submission (or a link's choices), shown again with a message per field
    _rejected: tuple[dict[str, str], dict[str, str]] | None = None
    _from_link = False  # those choices came with a link (options_from_query): the form says nothing started
    # the last check: (what it checked: the options and the settings, as JSON; their model; their profile; when),
    # for the start that follows
    _validated: tuple[str, SpawnOptions, Profile, float] | None = None

    def _profiles(self) -> list[Profile]:
        return [Profile(**p) for p in self.profiles]

    def _limits(self) -> dict[str, Limit]:
        """The scheduler's partition limits (cached), narrowed by the admin's."""
        return merge_limits(self.queries.partitions(), self.limits, list(self.partitions) or None)

    def _site_options(self) -> list[str]:
        """The #SBATCH options the site sets for every server (batchspawner's req_* settings, compat.py)."""
        return compat.sbatch_options({name: getattr(self, name) for name in (*compat.SBATCH, "req_options")})

    def _site_qos(self) -> str:
        """The QOS the site sets for every server (batchspawner's req_qos, or --qos/-q in req_options), or ""."""
        for option in self._site_options():  # one word each (compat.sbatch_options): --qos=Q or -qQ
            if option.startswith("--qos="):
                return option.removeprefix("--qos=")
            if option.startswith("-q") and len(option) > 2:
                return option[2:]
        return ""

    def _environments(self) -> dict[str, str]:
        return dict(self.environments) or self.queries.site_environments()

    def _validate(self, raw: dict[str, Any]) -> tuple[SpawnOptions, Profile]:
        """``raw`` checked against the profiles, the limits and the environments, and remembered: the start that
        follows (its check, its two scripts) uses these, and validates again only options that differ."""
        self.check_account()  # before any question about the user: never for a name the site refuses
        options, profile = validate(raw, self._profiles(), self._limits(), self._environments(),
                                    self.queries.associations(self.user.name, self.log), self._site_qos())
        checked = options.model_dump()
        self._validated = (self._checked_against(checked), options, profile, time.monotonic())
        self.log.info("%s: options checked: %s", self._log_name, checked)
        return options, profile

    def _checked_against(self, raw: dict[str, Any]) -> str:
        """``raw`` and the settings a check reads, as one JSON text: a check stands only for exactly these options
        (types too: true is not 1) under exactly these settings (a group's override or a pre-spawn hook may change
        them between the form's check and the start)."""
        settings = [self.profiles, self.limits, list(self.partitions), self.environments]
        return json.dumps([raw, settings], sort_keys=True, default=str)

    def _valid(self) -> tuple[SpawnOptions, Profile]:
        """user_options, validated once per start (_validate): the form's check, if they are what it returned, the
        settings are those it read, and it is at most CHECK_KEPT_FOR seconds old (the start JupyterHub runs at
        once); else checked now. Each start forgets the check as it ends, refused or not."""
        raw, kept = self.user_options or {}, self._validated
        if kept is not None and time.monotonic() - kept[3] <= CHECK_KEPT_FOR and kept[0] == self._checked_against(raw):
            return kept[1], kept[2]
        return self._validate(raw)

    async def current_limits(self) -> dict[str, Limit]:
        return await asyncio.to_thread(self._limits)

    async def _render_form(self, spawner: Any = None) -> str:
        self.check_account()  # the estimates run sbatch as this user: never for an account the site refuses
        values, errors = self._rejected or ({}, {})
        note = FROM_LINK if self._from_link else ""
        self._rejected, self._from_link = None, False
        environments = await asyncio.to_thread(self._environments)
        profiles = self._profiles()
        said: dict[str, str] = {}
        if self.start_estimates:  # at most estimates.WAIT seconds more for the form; else the last ones
            prefix = shlex.split(self.exec_prefix.format(username=self.user.name))
            found = await self.queries.start_estimates(self.user.name, prefix, profiles, command_env())
            now = time.time()
            said = {name: e.words(now) for name, e in found.items()}
        found = await asyncio.to_thread(self.queries.associations, self.user.name, self.log)
        return render(profiles, await self.current_limits(), environments, values, errors, said, note, found,
                      self._site_qos())

    async def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        """The form's values, validated (sinfo and the site envs' scan run off the event loop)."""
        return await asyncio.to_thread(self._checked, {k: v[0] for k, v in formdata.items() if v}, True)

    async def options_from_query(self, query: dict[str, list[str]]) -> dict[str, Any]:
        """A link's choices fill the form, and never start a server: whoever follows a link (another site's, or a
        message's) presses Start themselves, after reading what it asks for and whom it charges."""
        self._rejected = ({k: v[0] for k, v in query.items() if k in FIELDS and v}, {})
        self._from_link = True
        refusal = HTTPError(400, log_message="a spawn link's choices were put in the form, not started")
        refusal.jupyterhub_message = None  # type: ignore[attr-defined]  # the form says why, not "Error: ..."
        raise refusal

    def _checked(self, raw: dict[str, Any], remember: bool = False) -> dict[str, Any]:
        try:
            options, _ = self._validate(raw)
        except OptionsError as err:
            if remember:
                self._rejected = ({k: str(v) for k, v in raw.items()}, err.errors)
            raise
        return options.model_dump()
