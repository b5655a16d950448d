"""The API's operations: jobs, cluster, apply, backfills, logs, membership, backup,
preview, status, audit."""
