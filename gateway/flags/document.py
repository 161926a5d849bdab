"""The flagd-format `flags.json` that states every ops flag at its default.

Deployments ship this as the ConfigMap behind `SPECGW_FLAGS_DIR` and edit it
there (targeting rules on `class` / `label` included); generating it from
`FlagValues` keeps the file and the code defaults from drifting apart:

    python -m gateway.flags.document > deploy/flags/flags.json
"""

from __future__ import annotations

import json
from typing import Any

from gateway.flags.values import SPECS, FlagValues, default_of

FLAGD_SCHEMA = "https://flagd.dev/schema/v0/flags.json"


def flags_document(defaults: FlagValues | None = None) -> dict[str, Any]:
    defaults = defaults or FlagValues()
    flags = {}
    for flag in SPECS:
        value = default_of(defaults, flag)
        flags[flag] = {
            "state": "ENABLED",
            "variants": {"default": value},
            "defaultVariant": "default",
        }
    return {"$schema": FLAGD_SCHEMA, "flags": flags}


if __name__ == "__main__":
    print(json.dumps(flags_document(), indent=2))
