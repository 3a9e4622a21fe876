"""The operator's side: the `ctr` command line, `ctr status`, `ctr deploy`."""
