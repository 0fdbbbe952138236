"""Analysis: offline answers from what runs recorded. Reads traces and records, never runs
anything (it imports neither the engine nor campaigns)."""

from abbench.analysis.replay import Replay, replay
from abbench.errors import TraceError
from abbench.records.route_trace import RouteTrace, parse_route_trace, read_route_trace

__all__ = ["Replay", "RouteTrace", "TraceError", "parse_route_trace", "read_route_trace",
           "replay"]
