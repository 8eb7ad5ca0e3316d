"""One deployment's worker: a thread that interprets its lifecycle machine (`deployment.DeploymentWorker`),
running the machine's commands (`commands`, `booting`, `recording`, `workloads`) through the edges and
collaborators of `services.WorkerServices`, never through the daemon."""

from dankserve.supervisor.worker.deployment import DeploymentWorker, machine_config
from dankserve.supervisor.worker.services import WorkerServices

__all__ = ["DeploymentWorker", "WorkerServices", "machine_config"]
