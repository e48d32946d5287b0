"""The reminders app: its duetime tasks (tasks.py), the queue its views schedule on
(queue.py), and the command that runs its dispatcher and worker (runduetime)."""
