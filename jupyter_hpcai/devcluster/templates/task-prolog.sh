#!/bin/sh
# Runs before every task of the dev cluster (${mode}); each "export" line lands in the task's environment.
# All "nodes" share one machine's /dev/shm: OpenMPI's shared-memory transport between them crashes, so
# ranks talk TCP.
echo "export OMPI_MCA_btl=self,tcp"
# Each node says it has more CPUs than the machine has cores, so ranks can outnumber cores: Open MPI must give its
# core away while it waits, as mpirun does by itself on a node it knows to be oversubscribed; spinning, one rank took
# the core its peer needed (a small model trained about 5x slower over MPI on 2 cores).
echo "export OMPI_MCA_mpi_yield_when_idle=1"
${loopback_only}
