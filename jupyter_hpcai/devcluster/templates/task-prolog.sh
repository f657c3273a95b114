#!/bin/sh
# Runs before every task of the dev cluster (${mode}); each "export" line lands in the task's environment.
# All "nodes" share one machine's /dev/shm: OpenMPI's shared-memory transport between them crashes, so
# ranks talk TCP.
echo "export OMPI_MCA_btl=self,tcp"
${loopback_only}
