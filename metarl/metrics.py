"""Prometheus exporter for what Flower does not export: queue depths, episodes per stage, stage
latency histograms, cost totals, policy version of every run (a finished run keeps its last one)."""

from __future__ import annotations

import socket
import time

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from metarl.store import queue_depths, read_metrics

LATENCY_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600)


class MetarlCollector:
    """Reads the records on every scrape (cheap aggregate queries)."""

    def __init__(self, database_url: str, broker_url: str | None):
        self.database_url = database_url
        self.broker_url = broker_url

    def collect(self):
        depth = GaugeMetricFamily("metarl_queue_depth", "Messages waiting per queue", labels=["queue"])
        for queue, value in queue_depths(self.broker_url).items():
            if value is not None:
                depth.add_metric([queue], value)
        yield depth
        reading = read_metrics(self.database_url, LATENCY_BUCKETS)
        stages = GaugeMetricFamily("metarl_episodes", "Episodes per run and stage", labels=["run", "run_id", "stage"])
        for line in reading.stage_episodes:
            stages.add_metric([line.run_name, line.run_id, line.stage], line.episodes)
        yield stages
        version = GaugeMetricFamily(
            "metarl_policy_version", "Policy version of each run: the current one while it runs, the last one once it ended", labels=["run", "run_id"]
        )
        for run in reading.policy_versions:
            version.add_metric([run.run_name, run.run_id], run.policy_version)
        yield version
        cost = CounterMetricFamily("metarl_cost_usd", "Dollars recorded in the cost ledger", labels=["source", "simulated"])
        for total in reading.costs:
            cost.add_metric([total.source, str(total.simulated).lower()], total.usd)
        yield cost
        histogram = HistogramMetricFamily("metarl_stage_seconds", "Duration of finished stage claims", labels=["stage"])
        for stage in reading.latencies:
            buckets = [(str(bound), count) for bound, count in zip(LATENCY_BUCKETS, stage.at_most)]
            buckets.append(("+Inf", stage.claims))
            histogram.add_metric([stage.stage], buckets, stage.seconds)
        yield histogram


def build_registry(database_url: str, broker_url: str | None) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(MetarlCollector(database_url, broker_url))
    return registry


def listen_problem(host: str, port: int) -> str | None:
    """Why the exporter could not listen on (host, port), told before anything starts; None when it can.

    Binds a throwaway socket of the family `start_http_server` would use (the first address
    `getaddrinfo` gives for the host) and closes it.
    """
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except socket.gaierror as err:
        return f"cannot listen on {host}:{port}: unknown host ({err.strerror})"
    except OSError as err:
        return f"cannot listen on {host}:{port}: {err.strerror or err}"
    return None


def serve_metrics(database_url: str, broker_url: str | None, host: str, port: int, interval_s: float) -> None:
    """Serve /metrics until interrupted."""
    start_http_server(port, addr=host, registry=build_registry(database_url, broker_url))
    print(f"serving Prometheus metrics on http://{host}:{port}/metrics", flush=True)
    while True:
        time.sleep(interval_s)
