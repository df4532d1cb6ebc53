"""Resumable offline batch jobs over the engine (``radixflow batch``)."""

from radixflow_jax.batch.runner import BatchJob, JobConfig, JobStats, JobStopped

__all__ = ["BatchJob", "JobConfig", "JobStats", "JobStopped"]
