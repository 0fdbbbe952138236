"""Campaigns: the `cells.toml` schema, planning, and running cells (runner)."""

from abbench.campaign.plan import describe_plan, plan_campaign, run_order
from abbench.campaign.schema import (
    CampaignSpec,
    CellSpec,
    Decision,
    Sweep,
    load_campaign,
    resolved_toml,
)
from abbench.errors import CampaignFileError

__all__ = [
    "CampaignFileError",
    "CampaignSpec",
    "CellSpec",
    "Decision",
    "Sweep",
    "describe_plan",
    "load_campaign",
    "plan_campaign",
    "resolved_toml",
    "run_order",
]
