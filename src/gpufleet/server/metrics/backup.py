"""Backup series (``loops/backup.py``), present when the server has ``--backup-dir``.

=================================================  ==========================================
``gpufleet_backup_last_success_timestamp_seconds``  UNIX time of the last backup written (at
                                                    start: the newest file in the directory);
                                                    absent until there is one
``gpufleet_backup_last_size_bytes``                 that backup's size (0 until this process
                                                    wrote one)
``gpufleet_backups_total``                          backups this process wrote
``gpufleet_backup_failures_total``                  backups that failed (each is retried)
``gpufleet_backup_files``                           the loop's files kept in the directory
``gpufleet_backup_deleted_total``                   files the retention deleted
=================================================  ==========================================

Under HA only the leader backs up: the other servers show what this process did while it
led. ``time() - gpufleet_backup_last_success_timestamp_seconds`` against the period is the
staleness to alert on.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.server.loops.backup import BackupStatus


class BackupCollector(Collector):
    def __init__(self, status: BackupStatus) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        s = self.status
        if s.last_success_at is not None:
            yield GaugeMetricFamily(
                "gpufleet_backup_last_success_timestamp_seconds",
                "UNIX time of the last database backup written.",
                value=s.last_success_at,
            )
        yield GaugeMetricFamily(
            "gpufleet_backup_last_size_bytes",
            "Size of the last backup this process wrote.",
            value=s.last_size,
        )
        yield CounterMetricFamily("gpufleet_backups", "Database backups written.", value=s.successes)
        yield CounterMetricFamily(
            "gpufleet_backup_failures", "Database backups that failed (each retried).", value=s.failures
        )
        yield GaugeMetricFamily(
            "gpufleet_backup_files", "Backups of the loop kept in --backup-dir.", value=s.files
        )
        yield CounterMetricFamily(
            "gpufleet_backup_deleted", "Backups deleted by the retention (--backup-keep).", value=s.deleted
        )


__all__ = ["BackupCollector"]
