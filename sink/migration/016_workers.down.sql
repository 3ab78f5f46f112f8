DROP TABLE {{schema}}.workers;
