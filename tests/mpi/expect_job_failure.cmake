# Runs an MPI job that must fail: it has to exit non-zero before TIMEOUT seconds and
# print a line matching EXPECT. A hang (killed by `timeout`) or a success fails the test.
#   cmake -DMPIEXEC=... -DRANKS=2 -DPROGRAM=... -DSCENARIO=... -DEXPECT=regex -DTIMEOUT=60
#         [-DMPI_FLAGS="--mca;btl;tcp,self"] -P expect_job_failure.cmake
set(ENV{OMPI_ALLOW_RUN_AS_ROOT} 1)
set(ENV{OMPI_ALLOW_RUN_AS_ROOT_CONFIRM} 1)
execute_process(
  COMMAND timeout -k 5 ${TIMEOUT} ${MPIEXEC} -n ${RANKS} --oversubscribe ${MPI_FLAGS}
          ${PROGRAM} ${SCENARIO}
  RESULT_VARIABLE status
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err)
set(all "${out}${err}")
message("${all}")
if(status STREQUAL "124" OR status STREQUAL "137")
  message(FATAL_ERROR "job hung: still running after ${TIMEOUT} s (status ${status})")
endif()
if(status STREQUAL "0")
  message(FATAL_ERROR "job exited 0 but scenario ${SCENARIO} must fail")
endif()
if(NOT all MATCHES "${EXPECT}")
  message(FATAL_ERROR "job failed (status ${status}) but no line matched: ${EXPECT}")
endif()
message("ok: exit status ${status}, matched: ${EXPECT}")
