from django.db import models


class Event(models.Model):
    """What happened and why, in words a user reads on the page of what it happened to (an instance, a run); each
    kind of event adds the foreign key to its subject."""

    at = models.DateTimeField()
    kind = models.CharField(max_length=40)
    message = models.TextField()

    class Meta:
        abstract = True
        ordering = ["-at", "-id"]

    def __str__(self):
        return f"{self.kind} at {self.at:%Y-%m-%d %H:%M:%S}"
