"""The cluster's control: its state and reducer, placement, and the coordinator."""
