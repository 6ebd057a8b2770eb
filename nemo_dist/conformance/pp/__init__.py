"""The pp suite: any pipeline-parallel split and schedule judged by behaviour against one process, in real worlds."""
