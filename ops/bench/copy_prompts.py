"""The copy workload's prompts (`ops/bench/copy_workload.py`): jobs whose answers copy long
spans of their input, as the jobs sent over Kafka often are. Six kinds, four prompts each:
rewrite in another tone keeping the facts, extract fields into JSON, fix a bug and return the
whole function, turn a list into a table, correct spelling, and reformat (YAML, CSV, a rename).
Written for this benchmark; each is one user message under the model's chat template."""

# ruff: noqa: E501 (prompts are text: a paragraph is one line, as a person would send it)

from __future__ import annotations

from typing import NamedTuple


class CopyPrompt(NamedTuple):
    kind: str
    text: str


KINDS = ("rewrite", "extract", "code-fix", "table", "proofread", "reformat")

PROMPTS: tuple[CopyPrompt, ...] = (
    # -- rewrite: another tone, the same facts --------------------------------------------
    CopyPrompt(
        "rewrite",
        """Rewrite this paragraph in a formal tone. Keep every fact, name and number.

Hey team! Quick update: the Riverside warehouse is moving to the new building on 14 Elm Street on March 3rd. Trucks will still arrive at 6 am, but the loading dock is now on the north side. Maria Lopez is in charge of the move, so send her your questions before February 20th. The old building closes for good on March 10th.""",
    ),
    CopyPrompt(
        "rewrite",
        """Rewrite this customer review so that it sounds polite and calm. Keep all the details.

I ordered the blue kettle (order 55812) on June 2 and it arrived on June 19, more than two weeks late. The lid does not close properly and the handle gets hot after one minute. I called support twice and nobody called me back. I want a replacement or my 49 dollars back.""",
    ),
    CopyPrompt(
        "rewrite",
        """Rewrite the following notice in plain, friendly language for children. Keep the dates and rules.

The municipal swimming pool will be open from 1 July to 31 August, from 9:00 to 18:00 every day. Children under 8 years of age must be accompanied by an adult. Running on the pool deck is prohibited. Food may only be eaten in the picnic area. Entry costs 3 euros for children and 5 euros for adults.""",
    ),
    CopyPrompt(
        "rewrite",
        """Rewrite this paragraph in the past tense. Change nothing else.

The team meets every Monday at nine. Anna presents the numbers from the week before, and Tom writes down the questions. After the meeting, everyone goes back to their desks and answers the emails from customers. At noon, the whole office eats lunch together in the small kitchen on the second floor.""",
    ),
    # -- extract: fields of a record into JSON ----------------------------------------------
    CopyPrompt(
        "extract",
        """Extract the following fields from the record as JSON: name, email, phone, city, order_id, total.

Record: Customer name: Daniel Okafor. Contact: daniel.okafor@example.com, phone +44 20 7946 0321. Shipping address: 22 Baker Road, Leeds. Order ID: A-99172. Items: 2 desk lamps, 1 office chair. Order total: 214.50 GBP. Paid by card on 12 April 2024.""",
    ),
    CopyPrompt(
        "extract",
        """Return a JSON object with the keys title, author, year, publisher and isbn for this book.

"The Quiet Harbour" is a novel by Helen Marsh, published in 2019 by Northwind Press. Its ISBN is 978-1-4028-9462-6. The book has 312 pages and tells the story of a lighthouse keeper on a small island.""",
    ),
    CopyPrompt(
        "extract",
        """Extract every person mentioned below into a JSON list of objects with the keys name, role and company.

The meeting was opened by Sarah Chen, chief financial officer at Brightline Foods. She introduced James Porter, head of logistics at Brightline Foods, and Aisha Rahman, a consultant from Keller and Partners. The minutes were taken by Peter Novak, an assistant at Brightline Foods.""",
    ),
    CopyPrompt(
        "extract",
        """Turn this job posting into JSON with the fields job_title, company, location, salary, start_date and requirements (a list).

Job title: Senior Data Engineer. Company: Polaris Analytics. Location: Berlin, Germany (hybrid). Salary: 75,000 to 90,000 EUR per year. Start date: 1 September 2024. Requirements: five years of Python experience, experience with Apache Kafka, good knowledge of SQL, fluent English.""",
    ),
    # -- code-fix: the whole function back --------------------------------------------------
    CopyPrompt(
        "code-fix",
        """This Python function should return the average of the numbers in a list, but it crashes on an empty list. Fix it so that it returns 0.0 for an empty list, and return the whole function.

```python
def average(numbers):
    total = 0
    for number in numbers:
        total = total + number
    count = len(numbers)
    result = total / count
    return result
```""",
    ),
    CopyPrompt(
        "code-fix",
        """Fix the bug in this function: it should return the largest value in the list, but it returns the wrong value for lists of negative numbers. Return the whole corrected function.

```python
def find_max(values):
    best = 0
    for value in values:
        if value > best:
            best = value
    return best
```""",
    ),
    CopyPrompt(
        "code-fix",
        """The function below should count how many words in a sentence start with a capital letter, but it never counts the first word. Fix it and return the complete function.

```python
def count_capitalized(sentence):
    words = sentence.split(" ")
    count = 0
    for i in range(1, len(words)):
        word = words[i]
        if word and word[0].isupper():
            count += 1
    return count
```""",
    ),
    CopyPrompt(
        "code-fix",
        """This JavaScript function should return the list of even numbers from an array, but it returns the odd ones. Fix it and return the whole function.

```javascript
function evenNumbers(numbers) {
  const result = [];
  for (const n of numbers) {
    if (n % 2 === 1) {
      result.push(n);
    }
  }
  return result;
}
```""",
    ),
    # -- table: a list into a table ---------------------------------------------------------
    CopyPrompt(
        "table",
        """Convert this list into a Markdown table with the columns City, Country and Population.

- Lisbon, Portugal, 545,000
- Vienna, Austria, 1,982,000
- Oslo, Norway, 709,000
- Dublin, Ireland, 592,000
- Prague, Czech Republic, 1,357,000
- Helsinki, Finland, 664,000""",
    ),
    CopyPrompt(
        "table",
        """Make a Markdown table of these products with the columns Product, Price and Stock.

Product: Wireless mouse, price 19.99, in stock: 140
Product: USB-C cable, price 7.49, in stock: 560
Product: Laptop stand, price 34.00, in stock: 75
Product: Mechanical keyboard, price 89.90, in stock: 32
Product: Webcam, price 45.50, in stock: 58""",
    ),
    CopyPrompt(
        "table",
        """Put this schedule into a table with the columns Day, Time, Room and Topic.

Monday 9:00 in Room A: Introduction to databases.
Tuesday 11:00 in Room B: Writing SQL queries.
Wednesday 9:00 in Room A: Indexes and performance.
Thursday 14:00 in Room C: Transactions.
Friday 10:00 in Room B: Backups and recovery.""",
    ),
    CopyPrompt(
        "table",
        """Convert the following employee list to a Markdown table with the columns Name, Department and Start year.

Emma Wilson works in Marketing and started in 2018.
Lucas Martin works in Finance and started in 2020.
Olivia Brown works in Engineering and started in 2016.
Noah Garcia works in Sales and started in 2021.
Sophia Lee works in Engineering and started in 2019.""",
    ),
    # -- proofread: the same text, corrected ------------------------------------------------
    CopyPrompt(
        "proofread",
        """Correct the spelling mistakes in this text and return the full corrected text.

Our compnay was founded in 1998 in a smal garage in Ohio. Today we employ more then three hundred people in five contries. We beleive that good software should be simple, fast and relyable. Every year we donate part of our profits to local schools and libarys.""",
    ),
    CopyPrompt(
        "proofread",
        """Fix the grammar of this email and return the whole email.

Dear Mr. Patel,
I am writing to informs you that the documents you was asking for is ready. You can picks them up from our office on Friday between 10 and 4. Please brings your identity card with you. If you has any questions, do not hesitate to contacting me.
Best regards,
Laura Kim""",
    ),
    CopyPrompt(
        "proofread",
        """Return this recipe with the typos fixed. Keep everything else the same.

Pancakes for four people:
1. Mix 200 grams of flour with two eggs and a pinch of salt.
2. Slowley add 300 millilitres of milk while stiring.
3. Let the batter rest for ten minuts.
4. Heat a litle butter in a pan and pour in one ladle of batter.
5. Cook each pancake for about one minite on each side.""",
    ),
    CopyPrompt(
        "proofread",
        """Add the missing punctuation and capital letters to this paragraph and return it.

the museum opens at ten in the morning and closes at six in the evening on weekdays on saturdays it stays open until eight tickets cost twelve dollars for adults and six dollars for students children under twelve enter for free guided tours start every hour from the main hall""",
    ),
    # -- reformat: the same data in another shape -------------------------------------------
    CopyPrompt(
        "reformat",
        """Convert this JSON into YAML.

{"server": {"host": "10.0.0.5", "port": 8080, "workers": 4}, "database": {"name": "orders", "user": "app", "pool_size": 10}, "logging": {"level": "info", "file": "/var/log/app.log"}}""",
    ),
    CopyPrompt(
        "reformat",
        """Convert this CSV into a JSON list of objects, one object per row.

id,name,city,age
1,Alice,Paris,34
2,Bob,Madrid,28
3,Chloe,Rome,41
4,David,Athens,37
5,Elena,Warsaw,25
6,Farid,Vienna,45
7,Greta,Oslo,31
8,Hugo,Lisbon,52""",
    ),
    CopyPrompt(
        "reformat",
        """Rename the variable `data` to `records` everywhere in this function and return the whole function.

```python
def summarize(data):
    if not data:
        return {}
    total = sum(item["amount"] for item in data)
    largest = max(data, key=lambda item: item["amount"])
    return {"count": len(data), "total": total, "largest": largest["name"]}
```""",
    ),
    CopyPrompt(
        "reformat",
        """Turn these meeting notes into a numbered list of action items, keeping the wording.

Notes: Ben will send the budget draft to the board by Thursday. Carla will book the conference room for the workshop on May 14. David will update the website with the new prices. Everyone will review the safety guidelines before the next meeting.""",
    ),
)
