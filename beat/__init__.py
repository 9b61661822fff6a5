"""Beat: the schedule and the control-plane tasks that run on its clock."""
