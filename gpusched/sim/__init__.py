"""The trace simulator and its trace formats: it replays jobs in simulated time
through core's placement and scheduling, the daemon's own code.
"""
