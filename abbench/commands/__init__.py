"""The `abbench` subcommands, one module each: `add_parser(sub)` mounts its parser (its
handler as the parser's `func`, which returns the exit status). These modules are the only
place that chains campaign → analysis → report; nothing imports them but `abbench.cli`."""

from abbench.commands import (
    calibrate,
    campaign,
    engine,
    fleet,
    imports,
    model,
    replay,
    report,
    sensors,
    sentinels,
    sim,
)

# In the order `abbench --help` lists them.
COMMANDS = (campaign, calibrate, engine, fleet, imports, model, replay, report, sensors,
            sentinels, sim)

__all__ = ["COMMANDS"]
