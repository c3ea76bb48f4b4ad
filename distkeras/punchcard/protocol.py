"""What a Punchcard client and its server agree on: the secret's header and the routes.

Both sides import this module; it imports nothing of either.
"""

SECRET_HEADER = "X-Punchcard-Secret"

# The routes: a submission is POSTed, everything else is a GET.
SUBMIT = "/api/submit"
STATE = "/api/state"
RESULT = "/api/result"
CANCEL = "/api/cancel"
DESTROY = "/api/destroy"
