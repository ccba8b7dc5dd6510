#include "coord/coordinator_ops.h"

namespace cusnap {

CoordinatorOps default_coordinator_ops() {
  CoordinatorOps ops;
  ops.checkpoint = checkpoint_job;
  ops.suspend = suspend_job_coded;
  ops.resume = resume_job_coded;
  ops.list_processes = list_job_processes;
  return ops;
}

}  // namespace cusnap
