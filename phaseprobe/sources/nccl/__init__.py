"""NCCL debug logs and nccl-tests tables: split by process, read line by line, modelled
into communicators."""
