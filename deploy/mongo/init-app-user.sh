# The gateway's own MongoDB user: readWrite on its database only (not root).
# Run once, at the first start of an empty data directory, by the mongo image's
# entrypoint (sourced by bash, before auth is on; `mongo` and `_js_escape` are
# the entrypoint's). docker-compose.yml mounts it in /docker-entrypoint-initdb.d.
# The password is the mongo_app_password secret; a later change of that file
# changes nothing here: see docs/deploy.md, "Rotating a secret".
app_db="${IMGATE_MONGO_DB:-im}"
app_password="$(cat /run/secrets/mongo_app_password)"
"${mongo[@]}" admin <<-EOJS
	db.createUser({
		user: "imgate",
		pwd: $(_js_escape "$app_password"),
		roles: [ { role: "readWrite", db: $(_js_escape "$app_db") } ]
	})
EOJS
unset app_password
