"""What users run: the command line, ``raftsched local`` and the embedded scheduler.
Nothing inside the package imports a face except the public ``raftsched`` module."""
