"""Outbound effects in Dagster: the delivery job, the sensor that launches it, and what is owed.

* ``idem_effects_deliver`` (one per config with effects; in-process executor set on the job)
  runs :func:`idem_platform.effects.delivery.deliver`, the function ``idem effects deliver``
  runs (run config ``ops: {idem_effects_deliver_op: {config: {effect: NAME}}}``, optional).
* ``idem_effects_sensor`` launches it when a row is due and no run of the job is queued or
  running: one delivery run at a time (a second would only find the first's claims locked),
  and a run key made of the due rows (keys and tries) and the last run of the job, so one due
  set is launched once, and again only if a run ended without taking it (it failed to start).
* ``effects_owed``, a WARN check on each table asset ``idem/<record_type>`` with effects:
  per effect the rows pending, delivered and failed and the age of the oldest pending one;
  it fails (warns) when a row failed or the oldest pending is older than the effect's
  ``warn_pending_after_seconds``. The table assets are specs, not materializable, so the
  check is not run by a materialization of its asset: each commit that writes the table
  reports an evaluation from its ``committed`` step (:func:`owed_evaluations`), so does
  every delivery run, and the check can be executed from the UI on its own.
* ``idem/<results_table>``, the asset of each effect's results table
  (:mod:`idem_platform.defs.results`): each delivery run that recorded answers reports a
  materialization of it.
"""

# No "from __future__ import annotations": Dagster reads the op's config class from its annotation.

from collections.abc import Iterator, Sequence
from typing import Any

import dagster as dg
from pydantic import Field

from idem_platform.config import IdemConfig
from idem_platform.config.effects import EffectConfig
from idem_platform.defs.metadata import to_metadata
from idem_platform.defs.resources import DEFAULT_KEYS, ResourceKeys
from idem_platform.defs.results import results_asset_specs, results_materializations
from idem_platform.defs.tables import table_key, writers
from idem_platform.effects.admin import due_rows, outbox_counts, owed
from idem_platform.effects.delivery import deliver
from idem_platform.errors import ConfigError
from idem_platform.redact import secrets_kept

JOB_NAME = "idem_effects_deliver"
OP_NAME = "idem_effects_deliver_op"
SENSOR_NAME = "idem_effects_sensor"
CHECK_NAME = "effects_owed"
SENSOR_INTERVAL_SECONDS = 30
# A run in one of these states holds or will hold claims: the sensor waits for it to end.
IN_PROGRESS = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


class DeliverEffectsConfig(dg.Config):
    """Run config of ``idem_effects_deliver``."""

    effect: str | None = Field(default=None, description="Only this effect's rows; unset: every effect of the config.")


def bounds_by_table(rules: Sequence[Any]) -> dict[str, dict[str, float]]:
    """record type -> {effect: ``warn_pending_after_seconds``} of ``rules`` (effects or their rules)."""
    out: dict[str, dict[str, float]] = {}
    for rule in rules:
        out.setdefault(rule.record_type, {})[rule.name] = float(rule.warn_pending_after_seconds)
    return out


def owed_evaluation(conn: Any, record_type: str, bounds: dict[str, float]) -> tuple[bool, dict[str, dg.MetadataValue]]:
    """The ``effects_owed`` verdict of one table and its metadata (flat counts per effect, the problems)."""
    fine, counts, problems = owed(conn, bounds)
    flat: dict[str, Any] = {}
    for name, entry in counts.items():
        for what in ("pending", "delivered", "failed"):
            flat[f"{name}/{what}"] = int(entry[what])
        oldest = entry["oldest_pending_seconds"]
        flat[f"{name}/oldest_pending_seconds"] = float(oldest) if oldest is not None else None
        flat[f"{name}/warn_pending_after_seconds"] = bounds[name]
    flat["problems"] = problems
    return fine, to_metadata(flat)


def owed_evaluations(conn: Any, bounds: dict[str, dict[str, float]]) -> list[dg.AssetCheckEvaluation]:
    """An ``effects_owed`` evaluation of each table in ``bounds`` (record type -> effect -> bound)."""
    out = []
    for record_type, table_bounds in sorted(bounds.items()):
        fine, metadata = owed_evaluation(conn, record_type, table_bounds)
        out.append(
            dg.AssetCheckEvaluation(
                asset_key=table_key(record_type), check_name=CHECK_NAME, passed=fine,
                severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
            )
        )
    return out


def _checked(config: IdemConfig) -> dict[str, dict[str, float]]:
    """The bounds of the effects whose record type has a table asset (a connector writes it)."""
    tables = writers(config)
    return {rt: b for rt, b in bounds_by_table(config.effects).items() if rt in tables}


def effects_owed_checks(config: IdemConfig, resource_keys: ResourceKeys = DEFAULT_KEYS) -> list[dg.AssetChecksDefinition]:
    """``effects_owed`` on each table asset with effects, executable on its own from the UI."""
    return [_owed_check(record_type, bounds, resource_keys) for record_type, bounds in _checked(config).items()]


def _owed_check(record_type: str, bounds: dict[str, float], resource_keys: ResourceKeys) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=table_key(record_type), name=CHECK_NAME, required_resource_keys={resource_keys.postgres},
        description=(
            f"What the effects on this table ({', '.join(sorted(bounds))}) owe: rows pending, delivered and "
            "failed, and the age of the oldest pending one. Warns when a row failed or the oldest pending row "
            "is older than the effect's warn_pending_after_seconds. Evaluated after each commit that writes "
            "the table and by every idem_effects_deliver run."
        ),
    )
    def effects_owed(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        with resource_keys.postgres_of(context).connection(autocommit=True) as conn:
            fine, metadata = owed_evaluation(conn, record_type, bounds)
        return dg.AssetCheckResult(passed=fine, severity=dg.AssetCheckSeverity.WARN, metadata=metadata)

    return effects_owed


def _chosen(config: IdemConfig, name: str | None) -> list[EffectConfig]:
    if name is None:
        return list(config.effects)
    chosen = [effect for effect in config.effects if effect.name == name]
    if not chosen:
        known = ", ".join(effect.name for effect in config.effects)
        raise ConfigError(f"no effect named {name!r} (known: {known})")
    return chosen


def deliver_job(
    config: IdemConfig, resource_keys: ResourceKeys = DEFAULT_KEYS, name: str = JOB_NAME
) -> dg.JobDefinition:
    """``idem_effects_deliver`` for ``config``'s effects (``name``: suffixed per component)."""
    checked = _checked(config)
    idem_config = config

    @dg.op(
        name=OP_NAME + name.removeprefix(JOB_NAME),  # op names are unique in a code location too
        required_resource_keys={resource_keys.postgres},
        description="Send the due outbox rows, each under its minted key (idem effects deliver does the same).",
    )
    def deliver_op(context: dg.OpExecutionContext, config: DeliverEffectsConfig) -> Iterator[Any]:
        chosen = _chosen(idem_config, config.effect)
        postgres = resource_keys.postgres_of(context)
        with secrets_kept():
            report = deliver(postgres.resolved_url, chosen)
        context.log.info(
            "%d delivered, %d to retry, %d failed in %d attempts", report.delivered, report.retrying,
            report.failed, report.attempts,
        )
        wanted = {e.record_type for e in chosen}
        delivered = {name: counts["delivered"] for name, counts in report.by_effect.items()}
        with postgres.connection(autocommit=True) as conn:
            yield from results_materializations(conn, chosen, delivered)  # idem/<results_table>
            yield from owed_evaluations(conn, {rt: b for rt, b in checked.items() if rt in wanted})
        result = {
            "delivered": report.delivered, "retrying": report.retrying, "failed": report.failed,
            "attempts": report.attempts, "lost_claims": report.lost_claims, "effects": report.by_effect,
        }
        yield dg.Output(result, metadata=to_metadata(result))

    @dg.job(
        name=name,
        executor_def=dg.in_process_executor,
        description="Deliver the outbox's due effects (idem effects deliver); run config: effect (only one's).",
    )
    def job() -> None:
        deliver_op()

    return job


def effects_sensor(
    config: IdemConfig, job: dg.JobDefinition, resource_keys: ResourceKeys = DEFAULT_KEYS, name: str = SENSOR_NAME
) -> dg.SensorDefinition:
    """The sensor that launches ``job`` when a row of ``config``'s effects is due (one run at a time)."""
    names = sorted(effect.name for effect in config.effects)

    @dg.sensor(
        name=name,
        job=job,
        minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
        default_status=dg.DefaultSensorStatus.RUNNING,
        required_resource_keys={resource_keys.postgres},
        description=(
            f"Launches {job.name} when an outbox row of {', '.join(names)} is due and no run of it is in progress."
        ),
    )
    def sensor(context: dg.SensorEvaluationContext, **_resources: Any) -> dg.RunRequest | dg.SkipReason:
        with resource_keys.postgres_of(context).connection(autocommit=True) as conn:
            due, digest = due_rows(conn, names)
            counts = outbox_counts(conn)
        pending = sum(counts.get(n, {}).get("pending", 0) for n in names)
        failed = sum(counts.get(n, {}).get("failed", 0) for n in names)
        running = context.instance.get_runs(filters=dg.RunsFilter(job_name=job.name, statuses=IN_PROGRESS), limit=1)
        if running:
            return dg.SkipReason(
                f"delivery run {running[0].run_id} is in progress; {due} due, {pending} pending, {failed} failed"
            )
        if not due or digest is None:
            return dg.SkipReason(f"nothing due: {pending} pending (not due yet or claimed), {failed} failed")
        # The due rows (keys and tries) and the last delivery run: a due set is launched once, and
        # again only after a run that ended without claiming it (one that failed to start).
        last = context.instance.get_runs(filters=dg.RunsFilter(job_name=job.name), limit=1)
        after = last[0].run_id if last else "none"
        return dg.RunRequest(run_key=f"due:{digest}:after:{after}", tags={"idem/effects_due": str(due)})

    return sensor


def effects_definitions(
    config: IdemConfig, resource_keys: ResourceKeys = DEFAULT_KEYS, job_suffix: str = ""
) -> dg.Definitions:
    """The delivery job, its sensor, the ``effects_owed`` checks and the results tables' assets;
    nothing for a config without effects."""
    if not config.effects:
        return dg.Definitions()
    job = deliver_job(config, resource_keys, name=JOB_NAME + job_suffix)
    return dg.Definitions(
        assets=results_asset_specs(config, resource_keys),
        jobs=[job],
        sensors=[effects_sensor(config, job, resource_keys, name=SENSOR_NAME + job_suffix)],
        asset_checks=effects_owed_checks(config, resource_keys),
    )
