#include "coord/coordinator_ops.h"

namespace cusnap {

CoordinatorOps default_coordinator_ops() {
  CoordinatorOps ops;
  ops.checkpoint = checkpoint_job;
  ops.suspend = suspend_job;
  ops.resume = resume_job;
  ops.list_processes = list_job_processes;
  return ops;
}

}  // namespace cusnap
