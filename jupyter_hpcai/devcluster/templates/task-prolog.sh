#!/bin/sh
# Runs before every task of the dev cluster; each "export" line lands in the task's environment.
# All "nodes" share one host: OpenMPI's shared-memory transport between them crashes, so use TCP
# on loopback.
echo "export OMPI_MCA_btl=self,tcp"
echo "export OMPI_MCA_btl_tcp_if_include=lo"
echo "export OMPI_MCA_oob_tcp_if_include=lo"
