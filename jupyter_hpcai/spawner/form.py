"""The resource form on the spawn page: profiles, then the values a user may adjust within the limits."""

from __future__ import annotations

import json
from collections.abc import Mapping
from html import escape

from .options import Limit, Profile

STYLE = """<style>
.hpcai-form .form-group{margin-bottom:.6em}.hpcai-form .hpcai-error{color:#b00020;font-weight:600}
.hpcai-form .hpcai-limits{font-size:90%;color:#555;margin:0 0 .8em 0;padding-left:1.2em}
</style>"""

SCRIPT = """<script>
(function(){var p=document.getElementById('hpcai-profile');if(!p)return;
p.addEventListener('change',function(){var d=JSON.parse(p.selectedOptions[0].dataset.values);
for(var k in d){var e=document.getElementById('hpcai-'+k);if(e)e.value=d[k];}});})();
</script>"""


def render(profiles: list[Profile], limits: Mapping[str, Limit], environments: Mapping[str, str],
           values: Mapping[str, str] | None = None, errors: Mapping[str, str] | None = None) -> str:
    """HTML for the form; ``values`` and ``errors`` re-show a rejected submission with a message per field."""
    errors = errors or {}
    first = profiles[0].model_dump() if profiles else {}
    values = {**{k: str(v) for k, v in first.items()}, **(values or {})}

    def err(name: str) -> str:
        return f'<div class="hpcai-error" id="hpcai-error-{name}">{escape(errors[name])}</div>' if name in errors else ""

    def field(name: str, label: str, control: str) -> str:
        return f'<div class="form-group"><label for="hpcai-{name}">{label}</label>{control}{err(name)}</div>'

    def number(name: str, minimum: int) -> str:
        return (f'<input class="form-control" type="number" min="{minimum}" id="hpcai-{name}" name="{name}" '
                f'value="{escape(values.get(name, ""))}">')

    def select(name: str, choices: list[tuple[str, str, str]]) -> str:
        opts = "".join(f'<option value="{escape(v)}"{extra}{" selected" if v == values.get(name) else ""}>{escape(t)}</option>'
                       for v, t, extra in choices)
        return f'<select class="form-control" id="hpcai-{name}" name="{name}">{opts}</select>'

    profile_choices = [(p.name, p.name, f" data-values='{escape(json.dumps(_defaults(p)))}'") for p in profiles]
    partition_choices = [(name, limit.describe(), "") for name, limit in limits.items()]
    env_choices = [("", "(server default)", "")] + [(k, v, "") for k, v in environments.items()]
    parts = [
        STYLE, '<div class="hpcai-form">',
        field("profile", "Profile", select("profile", profile_choices)),
        '<ul class="hpcai-limits">' + "".join(f"<li>{escape(limit.describe())}</li>" for limit in limits.values()) + "</ul>",
        field("partition", "Partition", select("partition", partition_choices)),
        field("nodes", "Nodes", number("nodes", 1)),
        field("gpus_per_node", "GPUs per node", number("gpus_per_node", 0)),
        field("walltime", "Walltime (HH:MM:SS)",
              f'<input class="form-control" id="hpcai-walltime" name="walltime" value="{escape(values.get("walltime", ""))}">'),
        field("account", "Account (optional)",
              f'<input class="form-control" id="hpcai-account" name="account" value="{escape(values.get("account", ""))}">'),
        field("environment", "Environment", select("environment", env_choices)),
        "</div>", SCRIPT,
    ]
    return "\n".join(parts)


def _defaults(profile: Profile) -> dict[str, str]:
    return {k: str(v) for k, v in profile.model_dump(include={"partition", "nodes", "gpus_per_node", "walltime",
                                                              "account", "environment"}).items()}
