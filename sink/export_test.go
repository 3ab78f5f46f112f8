package sink

// Quote exposes quote to the external tests: FuzzValidateSchema checks that a
// name ValidateSchema accepts always quotes to a plain identifier.
var Quote = quote

// LoadMigrationsFrom exposes the migration loader to tests that feed it a
// directory of their own.
var LoadMigrationsFrom = loadMigrationsFrom
