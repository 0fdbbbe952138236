"""Runs made elsewhere (bmoe CSVs, `.log`, `.metrics`, `.state`, driver logs) → run folders."""

from abbench.errors import ForeignRunError, OrderWarning
from abbench.importers.driverlog import DriverEntry, parse_driver_log, read_driver_log
from abbench.importers.enginelog import parse_engine_log, read_engine_log
from abbench.importers.folder import import_folder
from abbench.importers.state import DeviceState, Snapshot, parse_state, read_state
from abbench.records.bmoe_csv import BmoeRun, parse_bmoe_csv, read_bmoe_csv
from abbench.records.metrics_file import parse_metrics, read_metrics

__all__ = [
    "BmoeRun", "DeviceState", "DriverEntry", "ForeignRunError", "OrderWarning", "Snapshot",
    "import_folder", "parse_bmoe_csv", "parse_driver_log", "parse_engine_log", "parse_metrics",
    "parse_state", "read_bmoe_csv", "read_driver_log", "read_engine_log", "read_metrics",
    "read_state",
]
