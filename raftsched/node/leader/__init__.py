"""The leader's room: its loop around the pure planner, plans in flight, admission control,
webhook delivery."""
