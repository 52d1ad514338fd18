"""The API's answers as pydantic models, one module per area; each route declares its own as
`response_model`, so that the OpenAPI document describes every response body.

The models describe what the routes build today (api/objects.py and the routes' own helpers) and
change none of it: each allows the fields it does not name (the product's extensions ride along,
documented in the field descriptions or the area's docs), declares its fields in the order the
answer holds them, and routes send only the keys they returned (`base.ObjectRoute`). Routes that
answer a ready `Response` (the hot paths: GET and create job, list jobs, events) are not checked
against their model at all; the model documents them.
"""
