"""What a run leaves and shows: its types, its folder, its printout and its control channel.

- :mod:`.run_types`: ``RunOptions``, ``NodeResult``, ``RunEvent``, ``RunResult``;
- :mod:`.run_folder`: ``<home>/runs/<name>/`` (``status.json`` written atomically, node folders,
  interrupted runs settled);
- :mod:`.display`: the console reporter and the node table;
- :mod:`.control`: ``sublimate stop/resume`` reaching a running run (its control files).
"""
