"""Fleets: one campaign on many devices, scheduled on Ray (docs/fleet.md). `devices` names the
devices and what makes each exclusive; `runner` runs each device's campaign where the
device is. Imported by `commands.fleet` only, so Ray is needed only by `abbench fleet`."""
